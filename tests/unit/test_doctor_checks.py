"""The doctor's judgements on facts of a cluster (the multi-broker ones without three brokers)."""

from __future__ import annotations

from typing import Any

from stepledger import wire
from stepledger.doctor.checks import (
    ClusterFacts,
    GroupFacts,
    Member,
    TopicFacts,
    check,
    unsafe,
)
from stepledger.doctor.passed import CHECKS, passed

SAFE = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "min.insync.replicas": "2",
    "message.timestamp.type": wire.STEP_LOG_TIMESTAMP_TYPE,
}


def facts(**changes: Any) -> ClusterFacts:
    values: dict[str, Any] = {
        "brokers": 3,
        "step_topic": "events",
        "dlq_topic": "dlq",
        "checkpoint_topic": "events-checkpoints",
        "topics": {
            "events": TopicFacts("events", 6, 3, SAFE),
            "dlq": TopicFacts("dlq", 3, 3, SAFE),
        },
        "groups": {},
    }
    return ClusterFacts(**{**values, **changes})


def found(cluster: ClusterFacts) -> set[tuple[str, str, str]]:
    return {(f.level, f.check, f.subject) for f in check(cluster, version="0.3.0")}


def test_a_replicated_cluster_that_keeps_everything_is_safe() -> None:
    assert found(facts()) == set()


def test_low_replication_and_min_insync_on_several_brokers_are_unsafe() -> None:
    thin = {**SAFE, "min.insync.replicas": "1"}
    topics = {"events": TopicFacts("events", 6, 2, thin), "dlq": TopicFacts("dlq", 3, 3, SAFE)}
    findings = check(facts(topics=topics), version="0.3.0")
    assert unsafe(findings)
    assert [(f.level, f.check) for f in findings] == [
        ("unsafe", "replication"),
        ("unsafe", "replication"),
    ]
    assert "factor 2 < 3" in findings[0].message and "min.insync.replicas=1" in findings[1].message


def test_a_compacted_checkpoint_topic_covers_a_finite_retention() -> None:
    finite = {**SAFE, "retention.ms": "86400000"}
    compacted = {**SAFE, "cleanup.policy": "compact"}
    topics = {
        "events": TopicFacts("events", 6, 3, finite),
        "dlq": TopicFacts("dlq", 3, 3, SAFE),
        "events-checkpoints": TopicFacts("events-checkpoints", 6, 3, compacted),
    }
    assert found(facts(topics=topics)) == {("info", "retention", "events")}
    assert ("unsafe", "retention", "events") in found(
        facts(topics={k: v for k, v in topics.items() if k != "events-checkpoints"})
    )


def test_members_of_another_or_no_version_and_lag_are_off_not_unsafe() -> None:
    group = GroupFacts(
        "stepledger-recovery",
        (
            Member("stepledger-recovery/0.3.0", frozenset({"events"})),
            Member("stepledger-recovery", frozenset()),
            Member("someone-else", frozenset()),
        ),
        lag={"events": 50_000},
    )
    findings = check(facts(groups={group.group_id: group}), version="0.3.0")
    assert not unsafe(findings)
    by_check = {f.check: f for f in findings}
    assert by_check["versions"].message.endswith(": stepledger-recovery")
    assert by_check["members"].message.startswith("3 members, 2 without a partition")
    assert by_check["lag"].level == "off" and "lag 50000" in by_check["lag"].message


def test_a_state_topic_holding_another_logs_records_is_unsafe_and_unnamed_ones_are_off() -> None:
    own = "events@A"
    origins = {"events-checkpoints": {own: 40, "orders@B": 3, "-": 2}, "changelog": {own: 9}}
    findings = check(facts(identity=own, state_origins=origins), version="0.3.0")
    shared = [(f.level, f.subject) for f in findings if f.check == "shared"]
    assert shared == [("unsafe", "events-checkpoints"), ("off", "events-checkpoints")]
    assert "orders@B (3)" in findings[0].message
    alone = facts(identity=own, state_origins={"events-checkpoints": {own: 40}})
    assert found(alone) == set()


def test_a_group_whose_members_read_another_step_log_is_shared() -> None:
    members = (Member("stepledger-projector/0.3.0", frozenset({"events", "orders"})),)
    group = GroupFacts("events.projector", members)
    assert ("off", "shared", "events.projector") in found(facts(groups={group.group_id: group}))


def test_a_healthy_cluster_is_told_what_passed_not_just_that_nothing_was_found() -> None:
    cluster = facts(groups={"g": GroupFacts("g", (Member("m", frozenset({"events"})),))})
    ok = {(f.level, f.check) for f in passed(cluster, check(cluster, version="0.3.0"))}
    assert {("ok", c) for c in ("topics", "replication", "retention", "timestamps")} <= ok
    assert {("ok", "members"), ("ok", "versions"), ("ok", "read")} <= ok
    assert ("info", "compaction") in ok  # no checkpoint topic: said, not passed
    assert {c for _, c in ok} <= set(CHECKS)


def test_a_failed_check_has_no_ok_line() -> None:
    topics = {"events": TopicFacts("events", 6, 2, SAFE), "dlq": TopicFacts("dlq", 3, 3, SAFE)}
    cluster = facts(topics=topics)
    ok = {f.check for f in passed(cluster, check(cluster, version="0.3.0"))}
    assert "replication" not in ok and "topics" in ok


def test_one_broker_names_where_the_only_copy_lives() -> None:
    dev = check(facts(brokers=1, cluster_id="tansu_cluster"), version="0.3.0")
    line = next(f.message for f in dev if f.check == "replication")
    assert "one disk" not in line and "Tansu" in line and "memory" in line
    kafka = check(facts(brokers=1, cluster_id="MkU3OEVBNTcwNTJENDM2Qg"), version="0.3.0")
    assert "broker's disk" in next(f.message for f in kafka if f.check == "replication")

"""The doctor's access checks and a fleet's quota, as data: what a role may do against its
permission table, a wildcard ACL over a fleet's topics, quota rates and kafka-configs lines."""

from __future__ import annotations

import pytest

from stepledger.doctor.access import AccessFacts, access_findings, wildcard_findings
from stepledger.fleets.quotas import Quota, kafka_configs_commands

AGENT_TABLE = {
    "fa": frozenset({"WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"}),
    "fa.checkpoints": frozenset({"READ", "DESCRIBE"}),
    "fa.deadletters": None,
    "fa.recovery-state": None,
    "fa.budget": frozenset({"WRITE", "READ", "DESCRIBE"}),
}


def _lines(
    topics: dict[str, frozenset[str] | None], cluster: frozenset[str] = frozenset()
) -> list[str]:
    facts = AccessFacts("fa", "agent", topics, cluster)
    return [f"{f.level} {f.message}" for f in access_findings(facts)]


def test_an_agent_holding_exactly_its_table_passes_both_lines() -> None:
    assert _lines(AGENT_TABLE) == [
        "ok holds what its table says on fa, fa.checkpoints, fa.budget",
        "ok can touch no other fleet's topic nor alter ACLs or quotas",
    ]


def test_seeing_another_fleets_topic_is_no_harm_writing_or_reading_it_is() -> None:
    seen = _lines({**AGENT_TABLE, "fb": frozenset({"DESCRIBE"})})
    assert "ok can touch no other fleet's topic nor alter ACLs or quotas" in seen
    written = _lines({**AGENT_TABLE, "fb": frozenset({"DESCRIBE", "WRITE", "READ"})})
    assert "unsafe may READ, WRITE TOPIC fb of another fleet: a fleet role must not" in written


def test_an_agent_that_may_write_its_fleets_checkpoints_or_alter_acls_is_unsafe() -> None:
    forged = {**AGENT_TABLE, "fa.checkpoints": frozenset({"READ", "DESCRIBE", "WRITE"})}
    assert ("unsafe may WRITE TOPIC fa.checkpoints of its own fleet, beyond its table: a fleet "
            "role must not") in _lines(forged)  # fmt: skip
    admin = _lines(AGENT_TABLE, frozenset({"ALTER", "DESCRIBE"}))
    assert ("unsafe may ALTER the CLUSTER (ACLs, quotas, topics): a fleet role must not"
            in admin)  # fmt: skip


def test_a_missing_permission_is_named_and_the_topic_not_described_counts_as_none() -> None:
    lines = _lines({**AGENT_TABLE, "fa": frozenset({"READ", "DESCRIBE"}), "fa.checkpoints": None})
    assert lines[:2] == [
        "unsafe lacks DESCRIBE_CONFIGS, WRITE on TOPIC fa: it cannot do its job",
        "unsafe lacks DESCRIBE, READ on TOPIC fa.checkpoints: it cannot do its job",
    ]


def test_a_wildcard_write_acl_is_reported_for_the_fleets_it_covers_only() -> None:
    acls = [("fb", "PREFIXED", "WRITE"), ("fa", "LITERAL", "READ"), ("*", "LITERAL", "ALL")]
    found = wildcard_findings(acls[:2], ["fa", "fb"], ["fa", "fb", "fb.checkpoints", "fbx"])
    assert [(f.level, f.subject, f.message) for f in found] == [
        ("unsafe", "fleet fb", "any principal may write fb, fb.checkpoints "
         "(ACL User:* WRITE TOPIC fb (prefix))"),
    ]  # fmt: skip
    everything = wildcard_findings(acls[2:], ["fa"], ["fa"])
    assert everything[0].message == "any principal may write fa (ACL User:* ALL TOPIC *)"
    assert wildcard_findings([], ["fa"], ["fa"])[0].level == "ok"


def test_a_quota_keeps_positive_rates_and_changes_only_those_named() -> None:
    quota = Quota.held({"producer_byte_rate": 1000.0})
    assert quota == Quota(1000, None, None)
    assert quota.changed({"request_percentage": 50}).describe() == (
        "producer_byte_rate=1000, request_percentage=50"
    )
    assert Quota(None, None, None).describe() == "no limit"
    with pytest.raises(ValueError, match="above 0"):
        Quota(producer_byte_rate=0)


def test_kafka_configs_lines_set_each_role_users_rates() -> None:
    lines = kafka_configs_commands("fa", Quota(2048, None, 50))
    assert len(lines) == 5
    assert lines[0] == (
        "kafka-configs --bootstrap-server $BOOTSTRAP --command-config admin.properties --alter "
        "--entity-type users --entity-name fa.agent "
        "--add-config 'producer_byte_rate=2048,request_percentage=50'"
    )
    assert kafka_configs_commands("fa", Quota(None, None, None)) == []

"""``stepledger doctor`` against Apache Kafka: what it reads, what it says, how it exits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from stepledger.cli import cli as main_group
from stepledger.config import Settings
from stepledger.kafka import admin
from stepledger_dev.apache_kafka import KafkaBroker
from tests.conftest import unique
from tests.integration.projector_helpers import wait_for

pytestmark = pytest.mark.kafka_only


def _doctor(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    common = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    done = CliRunner().invoke(
        main_group, ["doctor", *common, "--dlq-topic", settings.dlq_topic, "--json", *args]
    )
    return done.exit_code, json.loads(done.output)


def _settled(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    """The doctor's report once every topic just created shows in the cluster's metadata."""
    found: list[tuple[int, dict[str, Any]]] = []

    def ready() -> bool:
        found[:] = [_doctor(settings, *args)]
        return not any(f["check"] == "topics" for f in found[0][1]["findings"])

    wait_for(ready, 30, "the new topics in the metadata")
    return found[0]


def _lines(report: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["level"], f["check"]) for f in report["findings"]}


def _create(
    settings: Settings, topic: str, partitions: int, config: dict[str, str], replicas: int = -1
) -> None:
    new = NewTopic(topic, partitions, replication_factor=replicas, config=config)
    client = admin(settings)  # kept alive until its futures are done
    for future in client.create_topics([new], operation_timeout=10).values():
        future.result(15)


@pytest.fixture
def members(settings: Settings) -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    yield made
    for consumer in made:
        consumer.close()


def test_doctor_names_each_unsafe_and_off_thing_and_exits_by_what_is_unsafe(
    make_settings: Any, members: list[Consumer]
) -> None:
    # A step log made by hand on broker defaults: Kafka's retention of 7 days.
    settings = make_settings(partitions=1, create=False)
    _create(settings, settings.topic, 1, {"retention.ms": "604800000"})
    _create(settings, settings.dlq_topic, 1, {})
    code, report = _settled(settings)
    assert code == 1 and report["brokers"] == 1
    assert ("unsafe", "retention") in _lines(report) and ("off", "replication") in _lines(report)
    assert ("off", "timestamps") in _lines(report)

    # A checkpoint topic covers the retention, but it is not compacted.
    checkpoints = unique("checkpoints")
    _create(settings, checkpoints, 1, {"cleanup.policy": "delete"})
    wait_for(
        lambda: (
            ("unsafe", "compaction")
            in _lines(_doctor(settings, "--checkpoint-topic", checkpoints)[1])
        ),
        30,
        "the checkpoint topic in the metadata",
    )
    code, report = _doctor(settings, "--checkpoint-topic", checkpoints)
    assert code == 1 and ("unsafe", "compaction") in _lines(report)
    assert ("info", "retention") in _lines(report)

    # A step log that keeps everything, stamped by the broker: nothing unsafe.
    kept = make_settings(create=False)
    _create(kept, kept.topic, 1, {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"})
    _create(kept, kept.dlq_topic, 1, {})
    group = unique("stepledger-projector")
    out = Producer(kept.client_config(**{"acks": "all"}))
    for i in range(5):
        out.produce(kept.topic, b"v", str(i).encode())
    assert out.flush(30) == 0
    # The group's offset is committed while it has no member (a member that has not joined
    # yet is refused with UNKNOWN_MEMBER_ID), then two members of another version join.
    committer = Consumer(kept.client_config(**{"group.id": group}))
    committer.commit(offsets=[TopicPartition(kept.topic, 0, 2)], asynchronous=False)
    committer.close()
    for client_id in ("stepledger-projector/0.0.1", "stepledger-projector/0.0.1"):
        consumer = Consumer(
            kept.client_config(
                **{"group.id": group, "client.id": client_id, "session.timeout.ms": 6000}
            )
        )
        consumer.subscribe([kept.topic])
        members.append(consumer)

    def stable() -> dict[str, Any] | None:
        for consumer in members:
            consumer.poll(0.1)
        _, seen = _doctor(kept, "--group", group, "--max-lag", "2")
        return seen if ("off", "members") in _lines(seen) else None

    report = wait_for(stable, 60, "both members in the group")
    code, _ = _doctor(kept, "--group", group, "--max-lag", "2")
    assert code == 0
    by_check = {f["check"]: f for f in report["findings"]}
    assert "2 members, 1 without a partition" in by_check["members"]["message"]
    assert "0.0.1" in by_check["versions"]["message"]
    assert by_check["lag"]["level"] == "off" and "lag 3" in by_check["lag"]["message"]
    assert report["unsafe"] == 0 and ("unsafe", "retention") not in _lines(report)
    assert ("off", "timestamps") not in _lines(report)
    # What passed is said too: the step log's timestamps and retention, the topics.
    ok = {(f["check"], f["subject"]) for f in report["passed"]}
    assert {("timestamps", kept.topic), ("retention", kept.topic), ("topics", "cluster")} <= ok
    assert "replication" in report["checked"]


def test_on_three_brokers_low_replication_and_min_insync_are_unsafe(tmp_path: Path) -> None:
    with KafkaBroker(nodes=3, log_dir=tmp_path / "kafka") as cluster:
        settings = Settings(
            bootstrap=cluster.bootstrap, topic=unique("events"), dlq_topic=unique("dlq")
        )
        kept = {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"}
        _create(settings, settings.topic, 3, kept, replicas=1)
        _create(settings, settings.dlq_topic, 3, {"min.insync.replicas": "1"}, replicas=3)

        # A node of a cluster just started can be missing from one metadata answer, and
        # one that has not seen a new topic yet cannot describe its configs (the doctor
        # then says it could not read them, and judges no min.insync.replicas: a CI run).
        def every_broker() -> tuple[int, dict[str, Any]] | None:
            seen = _settled(settings)
            unread = any(f["check"] == "read" for f in seen[1]["findings"])
            return seen if seen[1]["brokers"] == 3 and not unread else None

        code, report = wait_for(every_broker, 60, "all three brokers and every topic's configs")
    assert code == 1 and report["brokers"] == 3
    unsafe = sorted(
        (f["subject"], f["message"]) for f in report["findings"] if f["level"] == "unsafe"
    )
    assert [subject for subject, _ in unsafe] == sorted([settings.dlq_topic, settings.topic])
    by_topic = dict(unsafe)
    assert "replication factor 1 < 3 on a 3-broker cluster" in by_topic[settings.topic]
    assert "min.insync.replicas=1 < 2" in by_topic[settings.dlq_topic]
    assert not any(f["check"] == "replication" and f["level"] == "off" for f in report["findings"])

"""Retention that cannot silently delete state (Apache Kafka: Tansu deletes nothing).

The head of a partition is removed with the admin client's DeleteRecords, which is what
segment expiry does to it.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from stepledger.config import Settings
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.errors import ApprovalPendingError, HistoryExpiredError
from stepledger.kafka import admin, ensure_topics
from stepledger.kafka.partitioner import configured, partition_of
from stepledger.kafka.topics import checkpoint_topic_config, describe_retention
from stepledger.producer import Ledger
from stepledger.recovery.changelog import KafkaCheckpointStore
from tests.conftest import unique
from tests.integration.projector_helpers import projecting, query_one, wait_for

kafka_only = pytest.mark.kafka_only
CLI = [sys.executable, "-m", "stepledger"]
EMAIL = Tool(name="email", effect="irreversible")


def cli(settings: Settings, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    return subprocess.run(
        [*CLI, *args, *where, "--dlq-topic", settings.dlq_topic],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def checkpointed_log(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> tuple[Settings, dict[str, str]]:
    """A one-partition step log made by ``stepledger init --checkpoints``, and its env."""
    settings = make_settings(create=False)
    env = {**src_env, "STEPLEDGER_CHECKPOINT_TOPIC": settings.checkpoint_topic}
    made = cli(settings, env, "init", "--partitions", "1", "--checkpoints")
    assert made.returncode == 0, made.stderr
    return settings, env


def partition_for(settings: Settings, workflow_id: str, partitions: int = 3) -> int:
    chosen = partition_of(workflow_id.encode(), partitions, configured(settings.client_config()))
    assert chosen is not None
    return chosen


def delete_head(settings: Settings, partition: int, before: int | None = None) -> int:
    """Delete a partition's records below ``before`` (default: all of them); the new start."""
    client = admin(settings)
    consumer_conf = settings.client_config(**{"group.id": unique("probe")})
    from confluent_kafka import Consumer

    probe = Consumer(consumer_conf)
    try:
        _, high = probe.get_watermark_offsets(TopicPartition(settings.topic, partition), 5.0)
    finally:
        probe.close()
    upto = high if before is None else before
    futures = client.delete_records([TopicPartition(settings.topic, partition, upto)])
    for future in futures.values():
        done = future.result(10)
        assert done.low_watermark == upto
    return int(upto)


def sender() -> tuple[list[str], Callable[[dict[str, Any], str], str]]:
    sent: list[str] = []

    def send(args: dict[str, Any], key: str) -> str:
        sent.append(str(args["to"]))
        return "sent"

    return sent, send


@kafka_only
def test_init_keeps_the_step_log_forever_and_refuses_a_bare_finite_retention(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    settings = make_settings(create=False)
    done = cli(settings, src_env, "init")
    assert done.returncode == 0, done.stderr
    found = describe_retention(settings, settings.topic)
    assert found.retention_ms == -1 and not found.deletes

    other = make_settings(create=False)
    refused = cli(other, src_env, "init", "--retention-ms", "86400000")
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "needs checkpoints" in refused.stderr

    with_checkpoints = make_settings(create=False, checkpoint_topic=unique("ckpt"))
    env = {**src_env, "STEPLEDGER_CHECKPOINT_TOPIC": with_checkpoints.checkpoint_topic}
    accepted = cli(with_checkpoints, env, "init", "--retention-ms", "86400000", "--checkpoints")
    assert accepted.returncode == 0, accepted.stderr
    assert describe_retention(with_checkpoints, with_checkpoints.topic).retention_ms == 86400000
    compacted = describe_retention(with_checkpoints, with_checkpoints.checkpoint_topic)
    assert compacted.cleanup_policy == "compact" and not compacted.deletes


@kafka_only
def test_a_reader_warns_once_when_the_step_log_can_expire(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(create=False)
    # As a topic made by the broker's defaults (7 days, delete): what init did before.
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    caplog.set_level(logging.INFO, logger="stepledger")
    with Ledger(settings) as ledger:
        ledger.workflow(unique("wf"))
        ledger.workflow(unique("wf"))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    lines = [r.getMessage() for r in warnings if "retention.ms=604800000" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in warnings]
    assert settings.topic in lines[0] and "loses its state" in lines[0]


@kafka_only
def test_a_workflow_whose_history_expired_is_never_run_as_new(settings: Settings) -> None:
    sent, send = sender()
    workflow_id = unique("expired")
    with Ledger(settings) as ledger:
        wf = ledger.workflow(workflow_id)
        wf.step("email", EMAIL, {"to": "ann@example.com"}, send)
    assert sent == ["ann@example.com"]
    partition = partition_for(settings, workflow_id)
    start = delete_head(settings, partition)

    with Ledger(settings) as ledger, pytest.raises(HistoryExpiredError) as caught:
        wf = ledger.workflow(workflow_id)
        wf.step("email", EMAIL, {"to": "ann@example.com"}, send)
    error = caught.value
    assert (error.workflow_id, error.partition, error.log_start) == (workflow_id, partition, start)
    assert f"first offset still there: {start}" in str(error)
    assert "\n" not in str(error)
    assert sent == ["ann@example.com"]  # on main the email went out twice
    # Nothing was appended for it: the partition still starts and ends at the deletion.
    from confluent_kafka import Consumer

    probe = Consumer(settings.client_config(**{"group.id": unique("probe")}))
    try:
        low, high = probe.get_watermark_offsets(TopicPartition(settings.topic, partition), 5.0)
    finally:
        probe.close()
    assert (low, high) == (start, start)


def watermarks(settings: Settings, partition: int) -> tuple[int, int]:
    from confluent_kafka import Consumer

    probe = Consumer(settings.client_config(**{"group.id": unique("probe")}))
    try:
        low, high = probe.get_watermark_offsets(TopicPartition(settings.topic, partition), 5.0)
    finally:
        probe.close()
    return int(low), int(high)


def start_workflows(settings: Settings, count: int) -> None:
    with Ledger(settings) as ledger:
        for _ in range(count):
            ledger.start(unique("wf"))


@kafka_only
def test_a_projector_down_across_a_deletion_reports_the_gap_and_keeps_it_queryable(
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    src_env: dict[str, str],
) -> None:
    settings = make_settings(partitions=1)
    db = tmp_path / "view.duckdb"
    start_workflows(settings, 30)
    with projecting(settings, db) as projector:
        projector.wait_received(30)
    start_workflows(settings, 70)  # projected by nobody: the projector is down
    assert delete_head(settings, 0) == 100
    start_workflows(settings, 10)
    caplog.set_level(logging.WARNING, logger="stepledger")
    with projecting(settings, db) as projector:
        projector.wait_received(10)
    lines = [r.getMessage() for r in caplog.records if "records lost" in r.getMessage()]
    assert lines == [
        f"projector: {settings.topic}[0] starts at offset 100, past the expected offset 30: "
        "70 records lost to retention or deletion before they were read"
    ]
    gaps = query_one(
        db, "SELECT topic, partition, expected_offset, log_start, records_lost FROM gaps"
    )
    assert gaps == [(settings.topic, 0, 30, 100, 70)]
    assert query_one(db, "SELECT count(*) FROM events") == [(40,)]
    assert query_one(db, "SELECT next_offset FROM offsets") == [(110,)]

    # A projector that never saw the partition says how far back it could go.
    fresh = tmp_path / "fresh.duckdb"
    with projecting(settings, fresh, group=unique("projector")) as projector:
        projector.wait_received(10)
    assert query_one(fresh, "SELECT expected_offset, log_start, records_lost FROM gaps") == [
        (0, 100, 100)
    ]

    # A rebuild and a tail from the beginning say how far back they could go.
    rebuilt = tmp_path / "rebuilt.duckdb"
    done = cli(settings, src_env, "rebuild", "--db", str(rebuilt))
    assert done.returncode == 0, done.stderr
    assert f"history before the log start is gone ({settings.topic}[0] from offset 100: 100 " in (
        done.stdout
    )
    assert query_one(rebuilt, "SELECT expected_offset, log_start FROM gaps") == [(0, 100)]
    tailed = cli(settings, src_env, "tail", "--from-beginning", "--no-follow")
    assert tailed.returncode == 0, tailed.stderr
    assert f"tail: {settings.topic}[0] starts at offset 100" in tailed.stderr
    assert len(tailed.stdout.strip().splitlines()) == 10


class Effects:
    """Counts each tool's effects, as the services would."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def fn(self, name: str) -> Callable[[dict[str, Any], str], str]:
        def call(args: dict[str, Any], key: str) -> str:
            self.calls[name] = self.calls.get(name, 0) + 1
            return f"{name}-done"

        return call


LOOKUP = Tool(name="lookup", effect="read_only")
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: None)
NOTIFY = Tool(name="notify", effect="irreversible", requires_approval=True)
PAY = Tool(name="pay", effect="idempotent", keyed=True)


def run_trip(ledger: Ledger, workflow_id: str, effects: Effects) -> None:
    wf = ledger.workflow(workflow_id)
    wf.step("lookup", LOOKUP, {"room": 1}, effects.fn("lookup"))
    wf.step("book", BOOK, {"room": 1}, effects.fn("book"))
    wf.step("notify", NOTIFY, {"to": "ann"}, effects.fn("notify"))
    wf.step("pay", PAY, {"cents": 100}, effects.fn("pay"))
    wf.finish()


@kafka_only
def test_a_workflow_waiting_on_an_approval_resumes_from_its_checkpoint_after_the_head_expired(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    settings, env = checkpointed_log(make_settings, src_env)
    effects = Effects()
    workflow_id = unique("trip")
    with Ledger(settings) as ledger:
        with pytest.raises(ApprovalPendingError):
            run_trip(ledger, workflow_id, effects)
        for _ in range(20):  # other workflows share the partition
            ledger.start(unique("other"))
    assert effects.calls == {"lookup": 1, "book": 1}
    once = cli(settings, env, "checkpoint", "--once")
    assert once.returncode == 0, once.stderr
    start = delete_head(settings, 0)
    assert watermarks(settings, 0) == (start, start)

    approved = cli(settings, env, "approve", workflow_id, "notify", "--by", "qa")
    assert approved.returncode == 0, approved.stderr
    with Ledger(settings) as ledger:
        run_trip(ledger, workflow_id, effects)
        # An id with no checkpoint and no record is proven new by the partition's progress.
        fresh = ledger.workflow(unique("fresh"))
        assert fresh.state.attempt == 1
    assert effects.calls == {"lookup": 1, "book": 1, "notify": 1, "pay": 1}
    with Ledger(settings) as ledger:
        run_trip(ledger, workflow_id, effects)  # finished: every step replays
    assert effects.calls == {"lookup": 1, "book": 1, "notify": 1, "pay": 1}


@kafka_only
def test_a_recovery_daemon_starting_below_the_log_start_reports_the_gap(
    make_settings: Callable[..., Settings], src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    start_workflows(settings, 12)
    assert delete_head(settings, 0, before=12) == 12
    start_workflows(settings, 3)
    # The example tools are loaded, never called: no step of these workflows is in doubt.
    env = {**src_env, "STEPLEDGER_EMAIL_URL": "http://127.0.0.1:9"}
    done = cli(
        settings,
        env,
        "recover",
        "--tools",
        "stepledger_dev.examples.tools:registry",
        "--no-entry-points",
        "--state-dir",
        str(tmp_path / "state"),
        "--group",
        unique("recovery"),
        "--max-seconds",
        "6",
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "records lost" in line]
    assert len(lines) == 1, done.stderr
    assert (
        f"recovery: {settings.topic}[0] starts at offset 12, past the expected offset 0: "
        "12 records lost" in lines[0]
    )


def recover(settings: Settings, env: dict[str, str], state: Path, group: str) -> list[str]:
    done = cli(
        settings,
        env,
        "recover",
        "--tools",
        "stepledger_dev.examples.tools:registry",
        "--no-entry-points",
        "--state-dir",
        str(state),
        "--group",
        group,
        "--log-format",
        "json",
        "--max-seconds",
        "5",
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines() + done.stdout.splitlines()


@kafka_only
def test_a_recovery_daemon_elsewhere_takes_a_partition_over_from_the_changelog(
    make_settings: Callable[..., Settings], src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=1, recovery_state_topic=unique("changelog"))
    env = {
        **src_env,
        "STEPLEDGER_EMAIL_URL": "http://127.0.0.1:9",
        "STEPLEDGER_RECOVERY_STATE_TOPIC": settings.recovery_state_topic,
    }
    never_due = Tool(name="email.send", effect="irreversible", timeout_s=3600)
    factory = EventFactory(settings.fleet_id, "agent")
    with Ledger(settings) as ledger:
        ledger.start("wf-open")
        ledger.log.append(factory.intent("wf-open", "s", never_due, {"to": "a"}, sequence=0))
    group = unique("recovery")
    first = recover(settings, env, tmp_path / "machine-a", group)
    assert any("no checkpoint for" in line for line in first)
    # Another machine: its own, empty state directory; nothing shared but Kafka.
    second = recover(settings, env, tmp_path / "machine-b", group)
    assert not any("no checkpoint for" in line for line in second), second
    assigned = [json.loads(line) for line in second if "partitions assigned" in line]
    assert assigned and assigned[0]["partitions"] == [[0, 2]]
    store = KafkaCheckpointStore(settings, group)
    restored = store.load(settings.topic, 0)
    store.close()
    assert restored is not None and restored.next_offset == 2
    assert list(restored.steps) == [("wf-open", "s")]


def broker_setting(settings: Settings, name: str) -> str | None:
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    client = admin(settings)
    broker = next(iter(client.list_topics(timeout=5).brokers))
    futures = client.describe_configs([ConfigResource("broker", str(broker))])
    entries = next(iter(futures.values())).result(10)
    return entries[name].value if name in entries else None


@kafka_only
def test_real_segment_expiry_then_an_approval_resumes_from_the_checkpoint(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    settings = make_settings(create=False)
    interval = broker_setting(settings, "log.retention.check.interval.ms")
    if interval is None or int(interval) > 1000:
        # The brokers the tests start check every second (stepledger_dev.apache_kafka).
        pytest.skip(f"the broker checks retention every {interval} ms, not every second")
    short = {"retention.ms": "2000", "segment.ms": "500", "cleanup.policy": "delete"}
    configs = {settings.topic: short, settings.checkpoint_topic: checkpoint_topic_config()}
    topics = [settings.topic, settings.dlq_topic, settings.checkpoint_topic]
    ensure_topics(settings, topics, partitions=1, configs=configs)
    env = {**src_env, "STEPLEDGER_CHECKPOINT_TOPIC": settings.checkpoint_topic}
    effects = Effects()
    workflow_id = unique("trip")
    with Ledger(settings) as ledger, pytest.raises(ApprovalPendingError):
        run_trip(ledger, workflow_id, effects)
    _, waited_at = watermarks(settings, 0)
    # The checkpointer runs all along, as in production.
    where = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    checkpointer = subprocess.Popen(
        [*CLI, "checkpoint", *where, "--every", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def expired() -> bool:
            # Each append after segment.ms rolls the active segment; the broker then
            # deletes the closed ones older than retention.ms.
            start_workflows(settings, 1)
            return watermarks(settings, 0)[0] >= waited_at

        wait_for(expired, 90, "the broker to expire the workflow's segments")
        approved = cli(settings, env, "approve", workflow_id, "notify", "--by", "qa")
        assert approved.returncode == 0, approved.stderr
        with Ledger(settings) as ledger:
            run_trip(ledger, workflow_id, effects)
    finally:
        checkpointer.send_signal(signal.SIGTERM)
        _, err = checkpointer.communicate(timeout=30)
    assert effects.calls == {"lookup": 1, "book": 1, "notify": 1, "pay": 1}
    assert checkpointer.returncode == 0, err
    assert "records lost" not in err


def run_paid(settings: Settings, count: int, prefix: str) -> None:
    with Ledger(settings) as ledger:
        for i in range(count):
            wf = ledger.workflow(f"{prefix}-{i}")
            wf.step("pay", PAY, {"cents": i}, lambda a, k: {"key": k})
            if i % 2:
                wf.finish()


def differing(a: Path, b: Path, table: str, where: str = "") -> int:
    import duckdb

    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        sql = (
            f"SELECT count(*) FROM ((SELECT * FROM a.{table} {where} EXCEPT ALL "
            f"SELECT * FROM b.{table} {where}) UNION ALL (SELECT * FROM b.{table} {where} "
            f"EXCEPT ALL SELECT * FROM a.{table} {where}))"
        )
        row = con.execute(sql).fetchone()
        return int(row[0]) if row else -1
    finally:
        con.close()


@kafka_only
def test_a_projector_down_across_a_deletion_restores_its_tables_from_the_checkpoints(
    make_settings: Callable[..., Settings], tmp_path: Path, src_env: dict[str, str]
) -> None:
    settings, env = checkpointed_log(make_settings, src_env)
    db = tmp_path / "view.duckdb"
    run_paid(settings, 10, "early")
    with projecting(settings, db) as projector:
        projector.wait_received(35)
    run_paid(settings, 20, "down")  # the projector is down
    assert cli(settings, env, "checkpoint", "--once").returncode == 0
    before = tmp_path / "before.duckdb"
    assert cli(settings, env, "rebuild", "--db", str(before)).returncode == 0
    _, high = watermarks(settings, 0)
    assert delete_head(settings, 0) == high
    run_paid(settings, 1, "after")
    with projecting(settings, db) as projector:
        # The records below the log start come back from the checkpoints, then the tail.
        projector.wait_received(high - 35 + 3)
    assert query_one(db, "SELECT count(*) FROM gaps") == [(0,)]
    assert query_one(db, "SELECT next_offset FROM offsets") == [(high + 3,)]
    for table in ("workflows", "steps", "escalations", "events"):
        where = "WHERE workflow_id NOT LIKE 'after-%'"
        assert differing(db, before, table, where) == 0, table
    assert query_one(db, "SELECT count(*) FROM workflows") == [(31,)]

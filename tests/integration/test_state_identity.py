"""State records name their step log by identity, not by name (invariant 21).

A step log deleted and created again under the same name is another log: the state of the
first (checkpoints, a recovery position) must not be taken for the second's.  And a
deployment upgraded from 0.3.0, whose records name no log, names its own with
``stepledger init --adopt-unnamed-state`` (never another topic's).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import pytest

from stepledger.checkpoints.record import WorkflowCheckpoint, encode
from stepledger.checkpoints.view import CheckpointView
from stepledger.config import Settings
from stepledger.kafka import DurableProducer, Headers, admin, ensure_topics, listed_topics, logid
from stepledger.kafka.topics import COMPACTED, checkpoint_topic_config, step_log_config
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger.recovery.checkpoint import CheckpointBatch
from tests.integration.test_retention import CLI, run_paid, watermarks

pytestmark = pytest.mark.kafka_only


def with_state_topics(make_settings: Callable[..., Settings]) -> Settings:
    """A one-partition step log with its checkpoint topic and recovery changelog."""
    settings = make_settings(partitions=1)
    configs = {
        settings.checkpoint_topic: checkpoint_topic_config(),
        settings.recovery_state_topic: dict(COMPACTED),
    }
    ensure_topics(settings, list(configs), partitions=1, configs=configs)
    return settings


def write(settings: Settings, topic: str, key: bytes, value: bytes, headers: Headers) -> None:
    producer = DurableProducer(settings)
    try:
        producer.wait(producer.send(topic, key, value, headers, partition=0))
    finally:
        producer.close()


def recreate_step_log(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Delete the step log and create it again under its name (and forget its old id)."""
    client = admin(settings)
    for future in client.delete_topics([settings.topic], operation_timeout=30).values():
        future.result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            configs = {settings.topic: step_log_config()}
            ensure_topics(settings, [settings.topic], partitions=1, configs=configs)
            break
        except Exception:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert settings.topic in listed_topics(settings)
    monkeypatch.setattr(logid, "_resolved", {})  # a process started after the re-creation


def test_state_of_a_step_log_deleted_and_created_again_is_not_the_new_logs(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = with_state_topics(make_settings)
    run_paid(settings, 5, "old")
    from stepledger.checkpoints.writer import Checkpointer

    checkpointer = Checkpointer(settings)
    try:
        checkpointer.catch_up(timeout_s=60)
    finally:
        checkpointer.close()
    store = KafkaCheckpointStore(settings, settings.recovery_group)
    try:
        store.save(settings.topic, CheckpointBatch(positions={0: 12}))
        assert store.load(settings.topic, 0) is not None
    finally:
        store.close()
    old = str(logid.resolve(settings))
    assert CheckpointView(settings).lookup(0, "old-1").checkpoint is not None

    recreate_step_log(settings, monkeypatch)
    run_paid(settings, 2, "new")
    assert str(logid.resolve(settings)) != old
    view = CheckpointView(settings)
    found = view.lookup(0, "old-1")
    assert found.checkpoint is None and found.progress is None
    assert view.refusals.counts[(settings.checkpoint_topic, old)] > 0
    store = KafkaCheckpointStore(settings, settings.recovery_group)
    try:
        assert store.load(settings.topic, 0) is None  # not the old log's position 12
        assert store.refusals.total > 0
    finally:
        store.close()


def test_init_adopts_the_unnamed_records_of_its_own_step_log_only(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    settings = with_state_topics(make_settings)
    run_paid(settings, 3, "wf")
    _, high = watermarks(settings, 0)
    # As 0.3.0 wrote them: no step log named; one of them is another topic's.
    ours = WorkflowCheckpoint("wf-1", settings.topic, 0, high - 1, status="running")
    progress = WorkflowCheckpoint(None, settings.topic, 0, high - 1)
    theirs = WorkflowCheckpoint("wf-2", "another-log", 0, 1, status="running")
    for record in (ours, progress, theirs):
        write(settings, settings.checkpoint_topic, record.key, encode(record), [])
    group = settings.recovery_group
    for topic, offset in ((settings.topic, b"7"), ("another-log", b"9")):
        key = json.dumps(["position", group, topic], separators=(",", ":")).encode()
        write(settings, settings.recovery_state_topic, key, offset, [])
    assert CheckpointView(settings).lookup(0, "wf-1").checkpoint is None  # refused

    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
    }
    env["STEPLEDGER_CHECKPOINT_TOPIC"] = settings.checkpoint_topic
    env["STEPLEDGER_DLQ_TOPIC"] = settings.dlq_topic
    done = subprocess.run(
        [*CLI, "init", "--partitions", "1", "--adopt-unnamed-state"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert f"{settings.checkpoint_topic}: 2 records written again" in done.stdout
    assert f"{settings.recovery_state_topic}: 1 records written again" in done.stdout
    found = CheckpointView(settings).lookup(0, "wf-1")
    assert found.checkpoint == ours and found.progress == high - 1
    assert CheckpointView(settings).lookup(0, "wf-2").checkpoint is None  # another topic's
    store = KafkaCheckpointStore(settings, group)
    try:
        loaded = store.load(settings.topic, 0)
        assert loaded is not None and loaded.next_offset == 7
    finally:
        store.close()

"""Recovery checkpoints per partition: the next owner resumes from them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.times import LATEST
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.unit.factories import LogStartAtZero, factory, pay_tool


def _record(value: bytes | None, partition: int, offset: int) -> Consumed:
    """A record as the daemon is handed it (no broker stamp)."""
    return Consumed("t", partition, offset, None, value)


def _daemon(tmp_path: Path, store: InMemoryCheckpointStore) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([pay_tool()]),
        DaemonOptions(state_dir=tmp_path, workers=1),
        log=InMemoryEventLog(),
        store=store,
        dead_letters=MemoryEventLetters(),
    )
    daemon._log_start = LogStartAtZero(daemon.settings)  # no broker: nothing deleted
    return daemon


def _moved_while_paused(
    tmp_path: Path, store: InMemoryCheckpointStore, read_before_pause: int
) -> tuple[RecoveryDaemon, RecoveryDaemon]:
    """Partition 0 of six intents: one daemon checkpoints the first two, reads on to
    ``read_before_pause`` and is paused past its session; the partition moves to a second
    daemon, which reads all six and checkpoints them."""
    paused = _daemon(tmp_path, store)
    paused._on_assign([("log", 0)])
    values = _intents(6)
    for offset, value in enumerate(values[:2]):
        paused._handle(_record(value, 0, offset))
    paused.checkpoint()
    assert store.positions[("log", 0)] == 2
    for offset, value in enumerate(values[2:read_before_pause], start=2):
        paused._handle(_record(value, 0, offset))  # read, never checkpointed
    owner = _daemon(tmp_path, store)
    owner._on_assign([("log", 0)])
    for offset, value in enumerate(values[2:], start=2):
        owner._handle(_record(value, 0, offset))
    owner.checkpoint()
    return paused, owner


def _intents(count: int) -> list[bytes]:
    events, codec = factory(), Codec()
    return [
        codec.encode(events.intent(f"wf-{i}", "pay", pay_tool(), {"n": i}, sequence=0))
        for i in range(count)
    ]


def test_a_partition_without_checkpoint_is_saved_at_once_and_its_replay_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = InMemoryCheckpointStore()
    first = _daemon(tmp_path, store)
    with caplog.at_level(logging.WARNING, logger="stepledger.recovery.daemon"):
        first._on_assign([("log", 3)])
    assert "no checkpoint for log[3]: replaying the partition from offset 0" in caplog.text
    # Nothing read yet, and revoked at once: the next owner still finds a checkpoint.
    first._on_revoke([("log", 3)])
    assert store.positions == {("log", 3): 0}
    caplog.clear()
    second = _daemon(tmp_path, store)
    with caplog.at_level(logging.WARNING, logger="stepledger.recovery.daemon"):
        second._on_assign([("log", 3)])
    assert "no checkpoint" not in caplog.text
    first.work.shutdown(wait=True)
    second.work.shutdown(wait=True)


def test_a_daemon_that_lost_a_partition_writes_nothing_over_its_new_owners_checkpoint(
    tmp_path: Path,
) -> None:
    store = InMemoryCheckpointStore()
    paused, owner = _moved_while_paused(tmp_path, store, read_before_pause=4)
    assert store.positions[("log", 0)] == 6
    tracked = set(store.steps[("log", 0)])
    paused._on_lost([("log", 0)])
    assert store.positions[("log", 0)] == 6, "the old owner wrote its stale position back"
    assert set(store.steps[("log", 0)]) == tracked
    assert paused.tracker.positions == {}
    paused.work.shutdown(wait=True)
    owner.work.shutdown(wait=True)


def test_a_checkpointed_step_due_at_the_end_of_time_is_taken_over_without_an_overflow(
    tmp_path: Path,
) -> None:
    # A schema-valid deadline of 9999-12-31 re-anchored at a take-over (now + its timeout)
    # overflowed datetime inside the assignment callback and stopped the daemon.
    events = factory()
    opened = events.workflow_started("wf-far", name="", attempt=1, read_only=False, max_attempts=3)
    event = events.intent("wf-far", "pay", pay_tool(), {"n": 1}, sequence=0)
    far = event.body.model_copy(update={"deadline": LATEST.replace(microsecond=999000)})
    value = Codec().encode(event.model_copy(update={"body": far}))
    store = InMemoryCheckpointStore()
    first = _daemon(tmp_path, store)
    first._on_assign([("log", 0)])
    first._handle(_record(Codec().encode(opened), 0, 0))
    first._handle(_record(value, 0, 1))
    first.checkpoint()
    owner = _daemon(tmp_path, store)
    owner._on_assign([("log", 0)])  # raised OverflowError before
    assert ("wf-far", "pay") in owner.tracker.steps
    first.work.shutdown(wait=True)
    owner.work.shutdown(wait=True)


def test_a_daemon_back_from_a_pause_writes_no_checkpoint_before_the_group_has_answered(
    tmp_path: Path,
) -> None:
    """Seen in the scale-out chaos run: a daemon SIGCONTed after its partition moved wrote
    its stale tracked intent (and its position) over the new owner's checkpoint before the
    group told it the partition was lost; the next owner then compensated a step an agent
    had settled."""
    store = InMemoryCheckpointStore()
    paused, owner = _moved_while_paused(tmp_path, store, read_before_pause=3)
    written = (store.positions[("log", 0)], dict(store.steps[("log", 0)]))
    # SIGCONT: its first poll ends a gap longer than the session, the group has not
    # answered yet, and its checkpoint interval is long past.
    paused.fence._last_poll -= paused.fence.session_s + 1
    paused.fence.polled()
    paused.checkpoint()
    assert (store.positions[("log", 0)], dict(store.steps[("log", 0)])) == written
    paused._on_lost([("log", 0)])  # the group's answer: nothing held is written
    assert (store.positions[("log", 0)], dict(store.steps[("log", 0)])) == written
    paused.work.shutdown(wait=True)
    owner.work.shutdown(wait=True)


def test_a_revoked_partition_is_handed_over_with_its_last_checkpoint(tmp_path: Path) -> None:
    store = InMemoryCheckpointStore()
    daemon = _daemon(tmp_path, store)
    daemon._on_assign([("log", 0)])
    for offset, value in enumerate(_intents(3)):
        daemon._handle(_record(value, 0, offset))
    daemon._on_revoke([("log", 0)])
    assert store.positions[("log", 0)] == 3 and len(store.steps[("log", 0)]) == 3
    daemon.work.shutdown(wait=True)

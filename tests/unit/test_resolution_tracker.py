"""The daemon's memory of open steps, and the checkpoint stores (one contract, two stores)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Tool
from stepledger.recovery.checkpoint import CheckpointStore, InMemoryCheckpointStore
from stepledger.recovery.tracker import Tracker
from tests.unit.factories import T0, factory, pay_tool

F = factory()
PAY = pay_tool(timeout_s=1)
READ = Tool(name="read", effect="read_only")
LATER = T0 + timedelta(minutes=5)


def due(step: StepState, arrival: rs.Arrival | None) -> datetime | None:
    return rs.due_at(step, PAY, grace=timedelta(0), arrival=arrival)


def intent(wf: str, tool: Tool = PAY) -> ev.Event:
    return F.intent(wf, "s", tool, {"a": 1}, sequence=0)


def outcome(wf: str, status: OutcomeStatus, source: Source = Source.AGENT) -> ev.Event:
    return F.outcome(wf, "s", attempt=1, status=status, source=source)


def feed(tracker: Tracker, events: list[ev.Event], partition: int = 0) -> None:
    for offset, event in enumerate(events, start=tracker.positions.get(partition, 0)):
        tracker.apply(event, partition, offset)


def test_tracks_open_intents_only_and_drops_what_agents_settled() -> None:
    tracker = Tracker(due)
    feed(
        tracker,
        [intent("a"), intent("b"), intent("r", READ), outcome("a", OutcomeStatus.SUCCEEDED)],
    )
    assert set(tracker.steps) == {("a", "s"), ("b", "s")}
    batch = tracker.take_batch(LATER)
    assert set(tracker.steps) == {("b", "s")} and tracker.open_count() == 1
    assert batch.positions == {0: 4} and (0, "a", "s") in batch.deletes
    assert list(batch.upserts) == [(0, "b", "s")]


def test_recovery_decisions_are_retained_for_late_outcomes_then_expire() -> None:
    tracker = Tracker(due, retain=timedelta(hours=1))
    feed(tracker, [intent("a"), outcome("a", OutcomeStatus.NOT_HAPPENED, Source.RECOVERY_QUERY)])
    tracker.take_batch(LATER)
    assert ("a", "s") in tracker.steps and tracker.open_count() == 0
    late = tracker.apply(outcome("a", OutcomeStatus.SUCCEEDED), 0, 2)
    assert late is not None and late.key == ("a", "s")
    tracker.take_batch(LATER + timedelta(hours=2), sweep=True)
    assert not tracker.steps


def test_due_respects_time_partitions_busy_and_echo() -> None:
    tracker = Tracker(due)
    feed(tracker, [intent("a")], partition=0)
    feed(tracker, [intent("b")], partition=1)
    assert tracker.due(T0, 10, {0, 1}) == []
    assert tracker.due(LATER, 10, {0}) == [("a", "s")]
    tracker.steps[("a", "s")].busy = True
    assert tracker.due(LATER + timedelta(seconds=1), 10, {0, 1}) == [("b", "s")]
    tracker.release(("a", "s"), echo_offset=5, not_before=None)
    assert tracker.due(LATER + timedelta(seconds=2), 10, {0}) == []  # echo not read yet
    feed(tracker, [intent("c")] * 6, partition=0)
    assert ("a", "s") in tracker.due(LATER + timedelta(seconds=3), 10, {0})


def test_revoked_partition_is_forgotten() -> None:
    tracker = Tracker(due)
    feed(tracker, [intent("a")], partition=0)
    feed(tracker, [intent("b")], partition=1)
    tracker.drop_partition(0)
    assert set(tracker.steps) == {("b", "s")} and tracker.partitions() == {1}


@pytest.fixture
def store() -> Iterator[CheckpointStore]:
    made: CheckpointStore = InMemoryCheckpointStore()
    yield made
    made.close()


def started(wf: str) -> ev.Event:
    return F.workflow_started(wf, name="", attempt=1, read_only=False, max_attempts=3, runner="A")


def test_checkpoint_round_trip_restores_positions_and_open_steps(store: CheckpointStore) -> None:
    tracker = Tracker(due)
    opened = [started("a"), started("b")]
    feed(tracker, [*opened, intent("a"), intent("b"), outcome("a", OutcomeStatus.SUCCEEDED)])
    store.save("topic", tracker.take_batch(LATER))
    assert store.load("topic", 1) is None
    restored = Tracker(due)
    assert restored.load(0, store.load("topic", 0)) == 5
    assert set(restored.steps) == {("b", "s")}
    assert restored.steps[("b", "s")].step.status is StepStatus.INTENDED
    feed(restored, [outcome("b", OutcomeStatus.FAILED)])
    store.save("topic", restored.take_batch(LATER))
    again = store.load("topic", 0)
    assert again is not None and again.next_offset == 6 and again.steps == {}


def test_a_late_outcome_in_a_checkpoint_is_handed_back_for_judging() -> None:
    store = InMemoryCheckpointStore()
    tracker = Tracker(due)
    late = outcome("a", OutcomeStatus.SUCCEEDED)
    feed(tracker, [intent("a"), outcome("a", OutcomeStatus.NOT_HAPPENED, Source.RECOVERY_QUERY)])
    assert tracker.apply(late, 0, 2) is not None
    store.save("topic", tracker.take_batch(LATER))
    restored = Tracker(due)
    restored.load(0, store.load("topic", 0))
    assert [(x.key, x.event.event_id) for x in restored.late] == [(("a", "s"), late.event_id)]

"""A pause that holds recovery: the fold, the operator's decision and the tracker (in memory).

The hold is one field of the pause (``hold_recovery``); the fold holds recovery from that
pause to its unpause; the recovery tracker folds the hold into the steps it tracks (as it
folds claims), so a held step is never due, also after a checkpoint's take-over or when
its intent came after the pause, and falls due by its deadline once unpaused.  A runner
opened meanwhile leaves its in-doubt steps as they are too (it is paused; a step it asks
for is settled once unpaused).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

import stepledger as sl
from stepledger.domain import events as ev
from stepledger.domain import operators
from stepledger.domain import resolution as rs
from stepledger.domain.state import StepState, WorkflowState, replay
from stepledger.errors import WorkflowPausedError
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.tracker import Tracker
from stepledger.testing import Crash, InMemoryEventLog, ManualClock, ledger_over
from tests.unit.factories import T0, factory, pay_tool

F = factory()
PAY = pay_tool(timeout_s=1)
LATER = T0 + timedelta(minutes=5)
KEY = ("a", "s")


def due(step: StepState, arrival: rs.Arrival | None) -> datetime | None:
    return rs.due_at(step, PAY, grace=timedelta(0), arrival=arrival)


def on(wf: str, body: ev.Body, n: int = 0) -> ev.Event:
    return F.envelope(wf, None, body, n)


def held(pause: int = 1) -> ev.WorkflowPaused:
    return ev.WorkflowPaused(by="ann", reason="incident", pause=pause, hold_recovery=True)


def opened(wf: str = "a") -> list[ev.Event]:
    start = F.workflow_started(wf, name="", attempt=1, read_only=False, max_attempts=3, runner="A")
    return [start, F.intent(wf, "s", PAY, {"a": 1}, sequence=0)]


def feed(tracker: Tracker, events: list[ev.Event], partition: int = 0) -> None:
    for offset, event in enumerate(events, start=tracker.positions.get(partition, 0)):
        tracker.apply(event, partition, offset)


def fold(*bodies: ev.Body) -> WorkflowState:
    return replay("a", opened()[:1] + [on("a", b, i) for i, b in enumerate(bodies)])


def test_the_fold_holds_recovery_from_a_held_pause_to_its_unpause() -> None:
    plain = fold(ev.WorkflowPaused(by="ann", pause=1))
    assert plain.paused and plain.recovery_held_by is None
    state = fold(held())
    assert state.recovery_held_by == "ann" and state.hold_lifted_at is None
    lifted = fold(held(), ev.WorkflowUnpaused(by="bob", pause=1))
    assert not lifted.paused and lifted.recovery_held_by is None
    assert lifted.recovery_hold == "pause 1 by ann: incident (unpaused by bob)"
    assert lifted.hold_lifted_at is not None
    stale = fold(held(2), ev.WorkflowUnpaused(by="bob", pause=1))
    assert stale.recovery_held_by == "ann" and [a.kind for a in stale.anomalies] == [
        "stale_unpause"
    ]


def test_a_held_pause_over_a_plain_one_is_a_new_pause_its_unpause_names() -> None:
    plain = fold(ev.WorkflowPaused(by="ann", pause=1))
    again = operators.pause(plain, "bob", "worse", None, hold_recovery=True)
    assert isinstance(again.body, ev.WorkflowPaused) and again.body.pause == 2
    assert again.note == "a: paused (pause 2, recovery held)"
    state = fold(ev.WorkflowPaused(by="ann", pause=1), again.body)
    assert state.recovery_held_by == "bob" and state.paused_by == "ann"
    assert operators.pause(state, "cy", "", None, hold_recovery=True).body is None
    assert operators.pause(plain, "cy", "", None).body is None  # a plain one over a plain one
    lift = operators.unpause(state, "cy", "", None).body
    assert isinstance(lift, ev.WorkflowUnpaused) and lift.pause == 2


def test_a_held_step_is_not_due_until_the_unpause() -> None:
    tracker = Tracker(due)
    feed(tracker, [*opened(), on("a", held())])
    assert tracker.due(LATER, 10, {0}) == [] and KEY in tracker.steps
    assert tracker.oldest_overdue_s(LATER) == 0.0 and tracker.open_count() == 1
    feed(tracker, [on("a", ev.WorkflowUnpaused(by="bob", pause=1), 1)])
    assert tracker.due(LATER, 10, {0}) == [KEY] and tracker.oldest_overdue_s(LATER) > 0
    assert tracker.snapshot(KEY).recovery_hold.startswith("pause 1 by ann")


def test_a_plain_pause_leaves_recovery_settling() -> None:
    tracker = Tracker(due)
    feed(tracker, [*opened(), on("a", ev.WorkflowPaused(by="ann", pause=1))])
    assert tracker.due(LATER, 10, {0}) == [KEY]
    assert len(tracker.events_of(KEY)) == 2  # the plain pause is not kept by the step


def test_an_intent_after_the_held_pause_is_held_too() -> None:
    tracker = Tracker(due)
    start = opened()[0]
    feed(tracker, [start, on("a", held()), F.intent("a", "s", PAY, {"a": 1}, sequence=0)])
    assert tracker.due(LATER, 10, {0}) == [] and KEY in tracker.steps
    feed(tracker, [on("a", ev.WorkflowUnpaused(by="bob", pause=1), 1)])
    assert tracker.due(LATER, 10, {0}) == [KEY]


def test_a_hold_survives_a_checkpoint_and_its_take_over() -> None:
    store = InMemoryCheckpointStore()
    tracker = Tracker(due)
    feed(tracker, [*opened(), on("a", held())])
    store.save("topic", tracker.take_batch(LATER))
    restored = Tracker(due)
    restored.load(0, store.load("topic", 0), now=T0)
    assert KEY in restored.steps and restored.due(LATER, 10, {0}) == []
    feed(restored, [on("a", ev.WorkflowUnpaused(by="bob", pause=1), 1)])
    assert KEY in restored.due(LATER + timedelta(seconds=1), 10, {0})


def test_a_runner_opened_on_a_held_workflow_leaves_its_in_doubt_step_until_the_unpause() -> None:
    log, clock, calls = InMemoryEventLog(), ManualClock(), list[str]()

    @sl.tool(effect="idempotent", keyed=True)
    def book(hotel: str, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise Crash  # the process dies inside the call: the step is in doubt
        return f"booked {hotel}"

    with pytest.raises(Crash):
        ledger_over(log, tools=[book], clock=clock).workflow("trip").step("b", book, hotel="h")
    state = replay("trip", log.workflow_events("trip"))
    held = operators.pause(state, "ann", "", None, hold_recovery=True).body
    assert held is not None
    log.append(on("trip", held))
    clock.advance(60)  # past the intent's deadline
    held_open = ledger_over(log, tools=[book], clock=clock).workflow("trip")
    assert held_open.state.steps["b"].in_doubt and len(calls) == 1  # not settled at the open
    with pytest.raises(WorkflowPausedError):
        held_open.step("b", book, hotel="h")
    assert len(calls) == 1
    state = replay("trip", log.workflow_events("trip"))
    lifted = operators.unpause(state, "bob", "", None).body
    assert lifted is not None
    log.append(on("trip", lifted, 1))
    wf = ledger_over(log, tools=[book], clock=clock).workflow("trip")
    assert wf.step("b", book, hotel="h") == "booked h" and calls[0] == calls[1]

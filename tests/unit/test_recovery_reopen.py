"""A step the daemon let go of is reopened by a compensation's intent, read back, and carried.

The tracker drops a step its agent settled; a saga's unwinding may later record
``compensation_intended`` for it, and an agent killed before ``compensation_outcome`` leaves
it compensating with nobody to finish it.  The tracker's rule (only a compensation's intent
reopens a step; its outcome ends the reopening unread; the workflow read back decides, by
the log's fold, whether the step is tracked again) is tested on the tracker alone, then
through the daemon on an in-memory log: the compensation is carried through once, without
a second claim; a zombie's fenced intent runs nothing; a hook that keeps failing is
counted and escalated.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import (
    CompensationStatus,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
)
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Tool
from stepledger.recovery.checkpoint import PartitionCheckpoint
from stepledger.recovery.tracker import Tracker
from tests.unit.daemon_loop import DaemonLoop
from tests.unit.factories import T0, comp_key, factory

WF, STEP = "wf-trip", "book"
ARGS = {"hotel": "Lisboa", "nights": 2}
GRACE = timedelta(seconds=1)
WAIT_S = 10.0


def book_tool(calls: list[tuple[Any, ...]] | None = None, *, fails: bool = False) -> Tool:
    """A keyed, undoable booking whose compensation records its calls (and may keep failing)."""

    def compensate(args: dict[str, Any], key: str, known: Any) -> Any:
        if calls is not None:
            calls.append((args, key, known))
        if fails:
            raise RuntimeError("the bookings service is down")
        return {"cancelled": key}

    return Tool(
        name="bookings.book",
        effect="compensatable",
        keyed=True,
        timeout_s=2,
        max_attempts=2,
        run=lambda args, key: {"booking": key},
        compensate=compensate,
    )


BOOK = book_tool()


def saga(*, zombie: bool = False) -> tuple[list[ev.Event], ev.Event]:
    """Runner A books, its outcome is recorded, then A unwinds (a zombie's claim if B claimed
    the workflow in between): the events before the compensation's intent, and the intent."""
    f = factory()
    before = [
        f.workflow_started(WF, name="trip", attempt=1, read_only=False, max_attempts=3, runner="A"),
        f.intent(WF, STEP, BOOK, ARGS, sequence=0, epoch=1, runner="A"),
        f.outcome(WF, STEP, attempt=1, status=OutcomeStatus.SUCCEEDED, result={"b": 1}),
    ]
    if zombie:
        before.append(f.workflow_resumed(WF, attempt=2, reason="crash", runner="B"))
    at = f.clock()
    body = ev.CompensationIntended(
        idempotency_key=comp_key(WF, STEP, BOOK),
        reason="the trip was called off",
        source=Source.AGENT,
        deadline=at + timedelta(seconds=BOOK.timeout_s),
        attempt=1,
        epoch=1,
        runner="A",
    )
    return before, f.envelope(WF, STEP, body, 1, "agent", "A")


def timeout(claim: ev.Event) -> timedelta:
    """The compensation's own timeout: its recorded deadline less when it was written."""
    assert isinstance(claim.body, ev.CompensationIntended)
    return claim.body.deadline - claim.occurred_at


def due(step: StepState, arrival: rs.Arrival | None) -> datetime | None:
    return rs.due_at(step, BOOK, grace=GRACE, arrival=arrival)


def let_go(tracker: Tracker, events: list[ev.Event], now: datetime) -> int:
    """Feed the events read at ``now`` and checkpoint: the settled step is let go of."""
    for offset, event in enumerate(events):
        tracker.apply(event, 0, offset, arrived=now)
    tracker.take_batch(now)
    assert (WF, STEP) not in tracker.steps
    return len(events)


# -- the tracker's rule ------------------------------------------------------------------


def test_a_compensation_of_a_step_let_go_of_reopens_it_and_its_workflow_read_back_tracks_it() -> (
    None
):
    now = T0 + timedelta(hours=1)  # the daemon's clock is an hour ahead of the agent's
    tracker = Tracker(due, grace=GRACE)
    before, claim = saga()
    offset = let_go(tracker, before, now)
    tracker.apply(claim, 0, offset, arrived=now)
    key = (WF, STEP)
    assert key not in tracker.steps and tracker.reopenings.get(key) is not None
    # Due by one clock: the claim's timeout after it reached the daemon, plus the grace.
    read_at = now + timeout(claim) + GRACE
    assert tracker.next_due() == read_at
    assert tracker.reopenings.due(read_at - timedelta(milliseconds=1), 10, {0}) == []
    assert tracker.reopenings.due(read_at, 10, {1}) == []  # not a partition caught up
    assert tracker.reopenings.due(read_at + timedelta(seconds=1), 10, {0}) == [key]
    state = tracker.reopened(key, [*before, claim])
    assert state is not None and not tracker.reopenings.steps
    tracked = tracker.steps[key]
    assert tracked.status is StepStatus.COMPENSATING and tracked.step.arguments_json
    # It falls due as any compensating step does: the tool's timeout after the claim's
    # arrival, plus the grace (the agent's clock, an hour behind, counts for nothing).
    carried_at = now + timedelta(seconds=BOOK.timeout_s) + GRACE
    assert tracked.due == carried_at and tracker.due(carried_at, 10, {0}) == [key]
    batch = tracker.take_batch(carried_at)
    assert (0, WF, STEP) in batch.upserts and (0, WF, STEP) not in batch.deletes


def test_a_compensations_outcome_ends_its_reopening_unread() -> None:
    now = T0 + timedelta(hours=1)
    tracker = Tracker(due, grace=GRACE)
    before, claim = saga()
    offset = let_go(tracker, before, now)
    tracker.apply(claim, 0, offset, arrived=now)
    assert (0, WF, STEP) in tracker.take_batch(now).upserts  # checkpointed meanwhile
    done = factory().envelope(
        WF,
        STEP,
        ev.CompensationOutcome(status=CompensationStatus.SUCCEEDED, source=Source.AGENT),
        1,
        "agent",
    )
    tracker.apply(done, 0, offset + 1, arrived=now)
    assert not tracker.reopenings.steps
    assert tracker.reopenings.due(now + timedelta(days=1), 10, {0}) == []
    assert (0, WF, STEP) in tracker.take_batch(now).deletes
    assert tracker.reopened((WF, STEP), [*before, claim, done]) is None


def test_a_zombies_fenced_compensation_intent_does_not_track_the_step_again() -> None:
    now = T0 + timedelta(hours=1)
    tracker = Tracker(due, grace=GRACE)
    before, claim = saga(zombie=True)
    offset = let_go(tracker, before, now)
    tracker.apply(claim, 0, offset, arrived=now)
    [key] = tracker.reopenings.due(now + timedelta(minutes=1), 10, {0})
    state = tracker.reopened(key, [*before, claim])
    assert state is not None and state.steps[STEP].status is StepStatus.SUCCEEDED
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]
    assert not tracker.steps and not tracker.reopenings.steps
    assert (0, WF, STEP) in tracker.take_batch(now).deletes


def test_only_a_compensations_intent_reopens_a_step_let_go_of() -> None:
    # A verdict settles a step (happened, not happened, compensated), an approval's decision
    # leaves it approved or denied (its intent then starts tracking), an outcome or an
    # abandonment of a step let go of needs nothing from recovery.
    now = T0 + timedelta(hours=1)
    tracker = Tracker(due, grace=GRACE)
    before, _ = saga()
    offset = let_go(tracker, before, now)
    f = factory()
    bodies: list[ev.Body] = [
        ev.EscalationResolved(escalation_id="e", verdict=Verdict.NOT_HAPPENED, by="ann"),
        ev.ApprovalDecided(granted=True, by="ann"),
        ev.StepAbandoned(reason="a person decides", escalation_id="e", source=Source.AGENT),
        ev.ResolutionAttempted(policy=ResolutionPolicy.COMPENSATE, attempt=1),
        ev.CompensationOutcome(status=CompensationStatus.SUCCEEDED, source=Source.AGENT),
    ]
    for i, body in enumerate(bodies):
        tracker.apply(f.envelope(WF, STEP, body, i), 0, offset + i, arrived=now)
    assert not tracker.steps and not tracker.reopenings.steps and tracker.changed == 0


def test_a_reopening_is_checkpointed_and_a_take_over_reads_it_back_a_timeout_later() -> None:
    now = T0 + timedelta(hours=1)
    first = Tracker(due, grace=GRACE)
    before, claim = saga()
    offset = let_go(first, before, now)
    first.apply(claim, 0, offset, arrived=now)
    resumed = factory().workflow_resumed(WF, attempt=2, reason="crash", runner="B")
    first.apply(resumed, 0, offset + 1, arrived=now)  # a claim read since joins it
    batch = first.take_batch(now)
    taken_at = now + timedelta(minutes=5)
    owner = Tracker(due, grace=GRACE)
    lines = {(WF, STEP): batch.upserts[(0, WF, STEP)]}
    assert owner.load(0, PartitionCheckpoint(offset + 2, lines), taken_at) == offset + 2
    assert not owner.steps  # a reopening, not a tracked step
    read_at = taken_at + timeout(claim) + GRACE
    assert owner.next_due() == read_at
    [key] = owner.reopenings.due(read_at, 10, {0})
    state = owner.reopened(key, [*before, claim])  # read before the resume landed in it
    # The resume came after the claim: it fences nothing, and the step is carried through.
    assert state is not None and state.attempt == 2 and state.runner == "B"
    assert owner.steps[key].status is StepStatus.COMPENSATING


# -- through the daemon --------------------------------------------------------------------


class Harness(DaemonLoop):
    """A recovery daemon on an in-memory log that it reads back through the SDK's reader
    for memory; every event appended (the agent's, the daemon's own) is fed to its loop."""

    def __init__(self, tmp_path: Path, tool: Tool) -> None:
        super().__init__(tmp_path, tool, grace=GRACE, restore=False, turns=200)

    def record(self, *events: ev.Event) -> None:
        """What an agent appends, read by the daemon."""
        for event in events:
            self.log.append(event)
        self.feed()

    def bodies(self, kind: type[ev.Body]) -> list[Any]:
        return [e.body for e in self.log.events if isinstance(e.body, kind)]


def unwound(harness: Harness, *, zombie: bool = False) -> None:
    """The saga up to its compensation's intent, the settled booking let go of between."""
    before, claim = saga(zombie=zombie)
    harness.record(*before)
    harness.daemon.checkpoint()
    assert (WF, STEP) not in harness.daemon.tracker.steps
    harness.record(claim)


def test_the_daemon_carries_a_compensation_left_in_doubt_through_once(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    harness = Harness(tmp_path, book_tool(calls))
    try:
        unwound(harness)
        key = (WF, STEP)

        def compensated() -> bool:
            tracked = harness.daemon.tracker.steps.get(key)
            return tracked is not None and tracked.status is StepStatus.COMPENSATED

        assert harness.until(compensated, timedelta(milliseconds=500))
        for _ in range(5):
            harness.clock.now += timedelta(minutes=1)
            harness.turn()  # nothing more falls due
    finally:
        harness.close()
    intent = harness.log.events[1].body
    assert isinstance(intent, ev.StepIntended)
    assert calls == [(ARGS, intent.idempotency_key, {"b": 1})]
    [done] = harness.bodies(ev.CompensationOutcome)
    assert done.source is Source.RECOVERY_COMPENSATE and done.status == "succeeded"
    # The agent's claim stood: recovery made none of its own.
    assert [c.source for c in harness.bodies(ev.CompensationIntended)] == [Source.AGENT]


def test_the_daemon_runs_nothing_for_a_zombies_fenced_compensation_intent(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    harness = Harness(tmp_path, book_tool(calls))
    try:
        unwound(harness, zombie=True)
        written = len(harness.log.events)
        tracker = harness.daemon.tracker
        assert tracker.reopenings.steps
        assert harness.until(lambda: not tracker.reopenings.steps, timedelta(seconds=1))
        for _ in range(5):
            harness.clock.now += timedelta(minutes=1)
            harness.turn()
    finally:
        harness.close()
    assert calls == [] and len(harness.log.events) == written
    assert not harness.daemon.tracker.steps


def test_a_compensation_that_keeps_failing_is_counted_then_escalated(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    harness = Harness(tmp_path, book_tool(calls, fails=True))
    try:
        unwound(harness)
        assert harness.until(lambda: bool(harness.bodies(ev.StepAbandoned)), timedelta(seconds=1))
    finally:
        harness.close()
    assert len(calls) == BOOK.max_attempts
    failed = harness.bodies(ev.ResolutionAttempted)
    assert [a.attempt for a in failed] == [1, 2] and all(a.error for a in failed)
    [abandoned] = harness.bodies(ev.StepAbandoned)
    assert abandoned.escalation_id and "recovery attempts failed" in abandoned.reason
    assert len(harness.daemon.dead_letters.letters) == 1  # type: ignore[attr-defined]

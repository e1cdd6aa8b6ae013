"""The daemon decides a step only from a fold that holds its workflow's claims.

Found by the simulator: a recovery daemon restarted from a checkpoint taken after a
workflow's resume, with none of its steps tracked then, no longer knew that claim; the
fenced-off first runner's intent, read after the restart, was tracked as live and
compensated (the booking of a trip the new owner completed was cancelled).  The claims
survived only inside tracked steps' checkpoint lines and in a bounded memory.  The rule
now: an intent of a workflow whose claims the tracker does not know (a partition taken over
from a checkpoint, a head deleted, a claim forgotten to stay within the bound) is held as
a reopening and judged by the log's fold once its workflow is read back (one mechanism with
the reopened compensations); the read teaches the tracker the claims.  Tested on the tracker
alone, then through the daemon taking a partition over from another's checkpoint.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Found, Tool
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore, PartitionCheckpoint
from stepledger.recovery.runs import LatestClaims
from stepledger.recovery.tracker import Tracker
from tests.unit.daemon_loop import DaemonLoop
from tests.unit.factories import T0, factory

WF = "wf-trip"
ARGS = {"hotel": "Lisboa"}
GRACE = timedelta(seconds=1)
NOW = T0 + timedelta(hours=1)  # the daemon's clock, an hour past the agents'


def book_tool(calls: list[str] | None = None) -> Tool:
    """A keyed, undoable booking whose query and compensation record that they ran."""

    def query(args: dict[str, Any], key: str) -> Found:
        if calls is not None:
            calls.append("query")
        return Found({"booking": key})

    def compensate(args: dict[str, Any], key: str, known: Any) -> Any:
        if calls is not None:
            calls.append("cancel")
        return {"cancelled": key}

    return Tool(
        name="bookings.book",
        effect="compensatable",
        keyed=True,
        timeout_s=2,
        run=lambda args, key: {"booking": key},
        query=query,
        compensate=compensate,
    )


BOOK = book_tool()
F = factory()
STARTED = F.workflow_started(
    WF, name="trip", attempt=1, read_only=False, max_attempts=3, runner="A"
)
RESUMED = F.workflow_resumed(WF, attempt=2, reason="crash", runner="B")


def intent(step_id: str, epoch: int, runner: str, sequence: int = 0) -> ev.Event:
    return F.intent(WF, step_id, BOOK, ARGS, sequence=sequence, epoch=epoch, runner=runner)


def due(step: StepState, arrival: rs.Arrival | None) -> datetime | None:
    return rs.due_at(step, BOOK, grace=GRACE, arrival=arrival)


def restarted_past(events: list[ev.Event]) -> Tracker:
    """A tracker that read ``events`` with no step tracked, checkpointed, and the tracker
    that takes the partition over from that checkpoint."""
    first = Tracker(due, grace=GRACE)
    for offset, event in enumerate(events):
        first.apply(event, 0, offset, arrived=NOW)
    batch = first.take_batch(NOW)
    assert not batch.upserts  # no step tracked: the claims are in no checkpoint entry
    owner = Tracker(due, grace=GRACE)
    owner.load(0, PartitionCheckpoint(batch.positions[0], {}), NOW)
    return owner


# -- the tracker's rule ------------------------------------------------------------------


def test_a_zombies_intent_read_after_a_take_over_past_the_claim_is_never_tracked() -> None:
    owner = restarted_past([STARTED, RESUMED])
    zombie = intent("book", epoch=1, runner="A")
    owner.apply(zombie, 0, 2, arrived=NOW)
    key = (WF, "book")
    assert key not in owner.steps and owner.reopenings.get(key) is not None
    # Held until its own deadline plus the grace, by the daemon's clock, then read back.
    read_at = NOW + timedelta(seconds=BOOK.timeout_s) + GRACE
    assert owner.reopenings.due(read_at - timedelta(milliseconds=1), 10, {0}) == []
    assert owner.reopenings.due(read_at, 10, {0}) == [key]
    state = owner.reopened(key, [STARTED, RESUMED, zombie])
    assert state is not None and [a.kind for a in state.anomalies] == ["zombie_intent"]
    assert not owner.steps and not owner.reopenings.steps
    # The read taught it the claims: the owner's next intent is tracked at once, and the
    # zombie's next one is fenced off without another read.
    owner.apply(intent("email", epoch=2, runner="B", sequence=1), 0, 3, arrived=NOW)
    owner.apply(intent("pay", epoch=1, runner="A", sequence=2), 0, 4, arrived=NOW)
    assert set(owner.steps) == {(WF, "email")} and not owner.reopenings.steps


def test_a_live_intent_held_after_a_take_over_is_tracked_once_read_and_falls_due_as_ever() -> None:
    owner = restarted_past([STARTED, RESUMED])
    live = intent("book", epoch=2, runner="B")
    owner.apply(live, 0, 2, arrived=NOW)
    key = (WF, "book")
    read_at = NOW + timedelta(seconds=BOOK.timeout_s) + GRACE
    [held] = owner.reopenings.due(read_at, 10, {0})
    owner.reopened(held, [STARTED, RESUMED, live])
    tracked = owner.steps[key]
    # Due as if it had been tracked from its arrival: its timeout after it, plus the grace.
    assert tracked.status is StepStatus.INTENDED and tracked.due == read_at
    assert owner.due(read_at, 10, {0}) == [key]


def test_an_outcome_ends_a_held_intent_unread() -> None:
    owner = restarted_past([STARTED, RESUMED])
    live = intent("book", epoch=2, runner="B")
    owner.apply(live, 0, 2, arrived=NOW)
    assert (0, WF, "book") in owner.take_batch(NOW).upserts  # held across a restart too
    done = F.outcome(WF, "book", attempt=1, status=OutcomeStatus.SUCCEEDED)
    owner.apply(done, 0, 3, arrived=NOW)
    assert not owner.reopenings.steps and not owner.steps
    assert (0, WF, "book") in owner.take_batch(NOW).deletes


def test_a_held_intent_is_checkpointed_as_held_and_a_take_over_holds_it_again() -> None:
    owner = restarted_past([STARTED, RESUMED])
    zombie = intent("book", epoch=1, runner="A")
    owner.apply(zombie, 0, 2, arrived=NOW)
    batch = owner.take_batch(NOW)
    again = Tracker(due, grace=GRACE)
    lines = {(WF, "book"): batch.upserts[(0, WF, "book")]}
    taken_at = NOW + timedelta(minutes=5)
    again.load(0, PartitionCheckpoint(3, lines), taken_at)
    assert not again.steps and (WF, "book") in again.reopenings.steps
    assert again.open_count() == 1  # still an open intent, for the gauge and health file
    [key] = again.reopenings.due(taken_at + timedelta(seconds=BOOK.timeout_s) + GRACE, 10, {0})
    again.reopened(key, [STARTED, RESUMED, zombie])
    assert not again.steps


def test_a_claim_forgotten_to_stay_within_the_bound_is_read_back_before_a_decision() -> None:
    tracker = Tracker(due, grace=GRACE)
    tracker._claims = LatestClaims(kept=1)
    other = F.workflow_started("other", name="", attempt=1, read_only=False, max_attempts=3)
    for offset, event in enumerate([STARTED, RESUMED, other]):  # "other" pushes wf out
        tracker.apply(event, 0, offset, arrived=NOW)
    tracker.apply(intent("book", epoch=1, runner="A"), 0, 3, arrived=NOW)
    assert (WF, "book") not in tracker.steps and (WF, "book") in tracker.reopenings.steps


def test_a_workflow_started_after_the_take_over_needs_no_read() -> None:
    owner = restarted_past([STARTED, RESUMED])
    fresh = F.workflow_started("new", name="", attempt=1, read_only=False, max_attempts=3)
    owner.apply(fresh, 0, 2, arrived=NOW)
    owner.apply(F.intent("new", "book", BOOK, ARGS, sequence=0, epoch=1), 0, 3, arrived=NOW)
    assert set(owner.steps) == {("new", "book")} and not owner.reopenings.steps


def test_a_partition_read_from_its_start_needs_no_read() -> None:
    tracker = Tracker(due, grace=GRACE)
    tracker.load(0, None, NOW)
    events = [STARTED, RESUMED, intent("book", epoch=1, runner="A"), intent("pay", 2, "B", 1)]
    for offset, event in enumerate(events):
        tracker.apply(event, 0, offset, arrived=NOW)
    assert set(tracker.steps) == {(WF, "pay")} and not tracker.reopenings.steps


def test_a_compensation_of_a_step_whose_entry_carried_no_claim_is_judged_by_a_read() -> None:
    # A checkpoint entry with no claim in it (written before this rule, or a workflow with
    # none then) says nothing of the claims: a compensation's intent for its step is not
    # folded into it (the daemon's claim board then answers "unknown": nothing runs) but
    # held and judged by the log's fold.
    decided = F.outcome(
        WF, "book", attempt=1, status=OutcomeStatus.SUCCEEDED, source=Source.RECOVERY_QUERY
    )
    settled = [intent("book", epoch=1, runner="A"), decided]
    owner = Tracker(due, grace=GRACE, retain=timedelta(days=1))
    lines = {(WF, "book"): [e.model_dump_json() for e in settled]}
    owner.load(0, PartitionCheckpoint(5, lines), NOW)
    assert (WF, "book") in owner.steps  # a retained decision: nothing to decide
    body = ev.CompensationIntended(
        idempotency_key="c",
        reason="undo",
        source=Source.AGENT,
        deadline=T0 + timedelta(seconds=2),
        attempt=1,
        epoch=1,
        runner="A",
    )
    claim = F.envelope(WF, "book", body, 1, "agent", "A")
    owner.apply(claim, 0, 5, arrived=NOW)
    assert (WF, "book") not in owner.steps and (WF, "book") in owner.reopenings.steps
    [key] = owner.reopenings.due(NOW + timedelta(minutes=1), 10, {0})
    state = owner.reopened(key, [STARTED, settled[0], RESUMED, decided, claim])
    assert state is not None and "zombie_compensation" in [a.kind for a in state.anomalies]
    assert not owner.steps


# -- through the daemon --------------------------------------------------------------------


class Daemon(DaemonLoop):
    """A recovery daemon on an in-memory log (read back through the SDK's in-memory reader),
    its checkpoints in a store that outlives it; every event appended is fed to its loop."""

    def __init__(
        self, tmp_path: Path, log: InMemoryEventLog, store: InMemoryCheckpointStore, tool: Tool
    ) -> None:
        super().__init__(tmp_path, tool, grace=GRACE, log=log, store=store)


def test_a_daemon_taking_over_past_a_claim_cancels_nothing_for_a_zombies_intent(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    tool = book_tool(calls)
    log, store = InMemoryEventLog(), InMemoryCheckpointStore()
    done = F.outcome(WF, "book", attempt=1, status=OutcomeStatus.SUCCEEDED)
    for event in [STARTED, RESUMED, intent("book", epoch=2, runner="B"), done]:
        log.append(event)
    first = Daemon(tmp_path, log, store, tool)
    first.feed()
    first.daemon.checkpoint()  # past B's claim; B's booking settled, so nothing tracked
    first.close()
    zombie = intent("book", epoch=1, runner="A")  # A, frozen since before B's claim, wakes
    log.append(zombie)
    written = len(log.events)
    owner = Daemon(tmp_path, log, store, tool)
    try:
        owner.feed()
        tracker = owner.daemon.tracker
        assert (WF, "book") not in tracker.steps
        assert owner.until(lambda: not tracker.reopenings.steps, timedelta(seconds=1))
        for _ in range(5):
            owner.clock.now += timedelta(minutes=1)
            owner.turn()  # nothing falls due
    finally:
        owner.close()
    assert calls == [] and len(log.events) == written  # no query, no cancel, no decision
    assert not owner.daemon.tracker.steps


def _racing_starts(
    tmp_path: Path, calls: list[str], timeout_s: float
) -> tuple[InMemoryEventLog, InMemoryCheckpointStore, Tool]:
    """Seed 78's race: B and A start the workflow at once, B first, and a daemon's checkpoint
    falls between the two starts; then A's intent (fenced off in the log), B's, and B's
    booking.  No query hook: the step's policy is to compensate it."""

    def cancel(args: dict[str, Any], key: str, known: Any) -> Any:
        calls.append("cancel")
        return {"cancelled": key}

    tool = Tool(
        name="bookings.book",
        effect="compensatable",
        keyed=True,
        timeout_s=timeout_s,
        run=lambda args, key: {"booking": key},
        compensate=cancel,
    )
    log, store = InMemoryEventLog(), InMemoryCheckpointStore()
    b_start = F.workflow_started(
        WF, name="trip", attempt=1, read_only=False, max_attempts=3, runner="B"
    )
    a_start = F.workflow_started(
        WF, name="trip", attempt=1, read_only=False, max_attempts=3, runner="A"
    )
    log.append(b_start)
    first = Daemon(tmp_path, log, store, tool)
    first.feed()
    first.daemon.checkpoint()  # past B's start, nothing tracked
    first.close()
    a_book = F.intent(WF, "book", tool, ARGS, sequence=0, epoch=1, runner="A")
    b_book = F.intent(WF, "book", tool, ARGS, sequence=0, epoch=1, runner="B")
    booked = F.outcome(WF, "book", attempt=1, status=OutcomeStatus.SUCCEEDED, runner="B")
    for event in [a_start, a_book, b_book, booked]:
        log.append(event)
    return log, store, tool


def test_a_racing_start_read_after_a_take_over_vouches_for_no_compensation(
    tmp_path: Path,
) -> None:
    # Found by the simulator (seed 78): B and A start the workflow at once, B first; the
    # daemon's checkpoint falls between the two starts, so after its restart A's losing
    # start is the first claim it reads and is taken as the workflow's first (enough to
    # track A's intent). B books and finishes; A's intent (fenced off in the log) falls
    # due and the daemon claims its compensation. Its claim board used to answer from the
    # tracker's fold, which took the claim (and would again at the next turn): the
    # booking of a trip B completed was cancelled. A compensation now needs claims vouched
    # for: the claim is held and judged by the log's fold, which refuses it.
    calls: list[str] = []
    log, store, tool = _racing_starts(tmp_path, calls, timeout_s=2)
    owner = Daemon(tmp_path, log, store, tool)
    key = (WF, "book")
    try:
        owner.feed()
        tracker = owner.daemon.tracker
        assert key in tracker.steps  # A's start was taken as the first claim: tracked
        claimed = owner.until(
            lambda: any(type(e.body) is ev.CompensationIntended for e in log.events),
            timedelta(seconds=1),
        )
        assert claimed  # the daemon claims the compensation of A's intent ...
        for _ in range(10):
            owner.clock.now += timedelta(seconds=1)
            owner.turn()
        assert calls == []  # the booking B made stands
        # ... and the log's fold, read back, refuses it: nothing tracked, nothing pending.
        assert owner.until(
            lambda: key not in tracker.steps and not tracker.reopenings.steps,
            timedelta(seconds=1),
        )
    finally:
        owner.close()
    assert calls == []  # the booking B made stands


def test_an_assumed_first_start_saved_in_a_checkpoint_is_still_only_assumed_after_a_restart(
    tmp_path: Path,
) -> None:
    # Seed 78's race, with one more restart: the daemon tracks A's intent under A's losing
    # start (assumed to be the first claim) and checkpoints it before the intent falls due.
    # The checkpoint kept the claims a tracked step was folded with; restored, they were
    # taken as known for sure, so the next daemon trusted its own fold and cancelled the
    # booking of a trip B completed.  An assumed claim is no longer saved: the restored
    # step is held and its workflow read back, and the log's fold refuses A's intent.
    calls: list[str] = []
    log, store, tool = _racing_starts(tmp_path, calls, timeout_s=30)
    key = (WF, "book")
    second = Daemon(tmp_path, log, store, tool)
    second.feed()
    assert key in second.daemon.tracker.steps  # tracked under the assumed start
    second.daemon.checkpoint()  # before A's intent falls due
    second.close()
    owner = Daemon(tmp_path, log, store, tool)
    try:
        owner.feed()
        tracker = owner.daemon.tracker
        # Saved without the assumed claim: held, to be read back before it is decided.
        assert key in tracker.reopenings.steps and key not in tracker.steps
        assert not tracker.vouches_claims(WF, 0)
        owner.until(
            lambda: any(type(e.body) is ev.CompensationIntended for e in log.events),
            timedelta(seconds=5),
        )
        for _ in range(10):
            owner.clock.now += timedelta(seconds=5)
            owner.turn()
        assert calls == []  # the booking B made stands
    finally:
        owner.close()
    assert calls == []

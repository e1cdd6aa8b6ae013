"""The daemon's memory: only the steps it may still have to act on, never all history.

A step is tracked from its intent (read-only intents are skipped) while it is open (an
intent or a compensation with no outcome), while it waits in the human queue, and for a
retention window after recovery or a human decided it (so a late outcome from a slow agent
can still be judged).  A step an agent settled itself is dropped at once; an event that
may make such a step actionable again (a saga's compensation of it) reopens it, and it is
tracked again once its workflow, read back, says it is (``recovery.reopen``).  Each tracked
step holds its own events (as Avro values, see ``recovery.tracked``), folded again in log
order whenever one more arrives, as every other reader folds them.  No I/O here: the daemon
feeds events in and takes checkpoint batches out.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass
from stepledger.domain.resolution import ACTIONABLE, Arrival
from stepledger.domain.state import StepState, WorkflowState, replay
from stepledger.recovery.checkpoint import PartitionCheckpoint, StepKey, decode_events
from stepledger.recovery.diff import CheckpointDiff
from stepledger.recovery.holds import HOLDS, HeldWorkflows, moves_hold
from stepledger.recovery.reopen import FENCED, Reopenings, reopens
from stepledger.recovery.runs import LatestClaims
from stepledger.recovery.tracked import (
    LATE_OUTCOME_KINDS,
    LateOutcome,
    Tracked,
    Values,
    decoded,
    stored,
)

#: When a step falls due on the daemon's clock, given when its events reached the daemon.
DueFn = Callable[[StepState, Arrival | None], datetime | None]
_CLAIMS = (ev.WorkflowStarted, ev.WorkflowResumed)
#: When an event reached the daemon, on its clock (None: not known).
Arrived = datetime | None

__all__ = ["LATE_OUTCOME_KINDS", "LateOutcome", "StepKey", "Tracked", "Tracker"]


class Tracker(CheckpointDiff):
    """Tracked steps by (workflow, step), with a due-time heap and a checkpoint diff."""

    def __init__(
        self,
        due: DueFn,
        *,
        retain: timedelta = timedelta(hours=24),
        grace: timedelta = timedelta(0),
    ) -> None:
        super().__init__(retain)
        self._due_of = due
        self.reopenings = Reopenings(grace)
        """Steps held back (reopened, or of unknown claims): read back at their deadline plus
        ``grace``."""
        self.steps: dict[StepKey, Tracked] = {}
        self.positions: dict[int, int] = {}
        self._heap: list[tuple[datetime, StepKey]] = []
        self.unloadable: list[tuple[StepKey, str]] = []
        """Checkpoint entries that could not be loaded (skipped), for the daemon to report."""
        self.late: list[LateOutcome] = []
        """Late outcomes found in loaded checkpoints, for the daemon to judge (or skip)."""
        self._claims = LatestClaims()
        self._held = HeldWorkflows()

    # -- partitions --------------------------------------------------------------------

    def load(
        self,
        partition: int,
        checkpoint: PartitionCheckpoint | None,
        now: datetime | None = None,
    ) -> int | None:
        """Take over a partition from its checkpoint; return the offset to resume at.

        A checkpoint keeps no arrival times: the loaded steps count as arrived ``now`` (the
        take-over), so a wait runs once more at most and never ends early; None leaves
        them to the recorded times.
        """
        self.drop_partition(partition)
        if checkpoint is None:
            # Saved at once as "nothing read yet", so the next owner resumes from a
            # checkpoint even when this daemon reads nothing before it loses the partition.
            self.positions[partition] = 0
            self._moved.add(partition)
            return None
        if checkpoint.next_offset > 0:
            self._claims.taken_over(partition)
        for key, lines in checkpoint.steps.items():
            try:
                self._load_step(partition, key, decode_events(lines), now)
            except Exception as exc:
                # One bad entry never stops the take-over: the step is re-read from the log
                # the next time one of its events arrives, and the daemon reports it.
                self.steps.pop(key, None)
                self.unloadable.append((key, f"{type(exc).__name__}: {exc}"))
        self.positions[partition] = checkpoint.next_offset
        return checkpoint.next_offset

    def _load_step(
        self, partition: int, key: StepKey, events: list[ev.Event], now: datetime | None
    ) -> None:
        state = replay(key[0], events)
        values = tuple(stored(event) for event in events)
        held = self.reopenings.restore(partition, key, events, values, now)
        for event, value in zip(events, values, strict=True):
            if isinstance(event.body, _CLAIMS):
                # The claims a tracked step was folded with survive a restart, and were its
                # workflow's all along; a reopening's are only those read since it reopened.
                self._claims.remember(event, value, partition=partition, known=not held)
        step = state.steps.get(key[1])
        if held or step is None:
            return
        self._held.took_all(events, values, partition)
        tracked = Tracked(partition, values, arrival=None if now is None else Arrival(now, now))
        tracked.took(step, self._due(state, step, tracked.arrival))
        self.steps[key] = tracked
        self._schedule(key, tracked)
        # A late outcome read before a crash but not judged yet must still be judged.
        late_ids = {a.event_id for a in state.anomalies if a.kind in LATE_OUTCOME_KINDS}
        self.late.extend(LateOutcome(key, e) for e in events if e.event_id in late_ids)

    def drop_partition(self, partition: int) -> None:
        """Forget a partition (revoked): its steps are another daemon's now."""
        for key in [k for k, t in self.steps.items() if t.partition == partition]:
            del self.steps[key]
            self._folds.drop(key)
            self._dirty.discard(key)
            self._check.discard(key)
        self._removed = {r for r in self._removed if r[0] != partition}
        self.reopenings.drop_partition(partition)
        self._claims.drop_partition(partition)  # its next owner may read newer claims
        self._held.drop_partition(partition)
        self.positions.pop(partition, None)
        self._moved.discard(partition)

    def skipped(self, partition: int) -> None:
        """Records before the partition's position were never read here (a deleted head)."""
        self._claims.taken_over(partition)

    def partitions(self) -> set[int]:
        """The partitions whose positions are known."""
        return set(self.positions)

    # -- events ------------------------------------------------------------------------

    def apply(
        self,
        event: ev.Event,
        partition: int,
        offset: int,
        value: bytes | None = None,
        arrived: datetime | None = None,
    ) -> LateOutcome | None:
        """Fold one consumed event in; return a late outcome if one needs judging.

        ``value`` is the record's value as read (kept instead of encoding the event again
        when it is in the stored framing); ``arrived`` is when it reached the daemon, on
        the daemon's clock and no earlier than its append (None: not known, the step's due
        time then goes by the recorded times).
        """
        self.positions[partition] = offset + 1
        self._moved.add(partition)
        if event.step_id is None:
            if isinstance(event.body, _CLAIMS):
                self._claimed(event, value, partition)
            elif isinstance(event.body, HOLDS):
                self._steered(event, value, partition)
            return None
        key = (event.workflow_id, event.step_id)
        tracked = self.steps.get(key)
        folded = None
        if tracked is None:
            body = event.body
            if key in self.reopenings.steps or reopens(event):
                self._hold(key, partition, event, value, arrived)
                return None
            if not isinstance(body, ev.StepIntended) or body.effect is EffectClass.READ_ONLY:
                return None
            if not self.knows_claims(event.workflow_id, partition):
                self._hold(key, partition, event, value, arrived)
                return None
            tracked, state = self._new_tracked(partition, event.workflow_id)
        else:
            folded = self._folds.take(key, tracked.values, self._decoder(key[0]))
            state = folded.fold(event.workflow_id)
            if event.event_id in state.seen:
                return None
            if self._unfenced(state, event, partition):
                # Its fold holds no claim (a checkpoint entry that carried none) and its
                # workflow's are not known: the log's fold, read back, judges this event.
                self._forget(key, tracked)
                self._hold(key, partition, event, value, arrived)
                return None
        before = state.steps.get(event.step_id)
        anomaly = state.apply(event)
        step = state.steps.get(event.step_id)
        if step is None:
            # An intent the fold refused, or the step's workflow started over (a read-only
            # restart carrying the step's id): nothing to track, whatever was tracked before.
            self._forget(key, tracked)
            return None
        values = (*tracked.values, stored(event, value))
        if folded is not None:
            folded.took(values, event)
        if self._moves_waits(before, step):
            tracked.arrived(event, arrived)
        self._took(key, tracked, values, state)
        if anomaly is not None and anomaly.kind in LATE_OUTCOME_KINDS:
            return LateOutcome(key, event)
        return None

    def reopened(self, key: StepKey, history: Sequence[ev.Event]) -> WorkflowState | None:
        """A reopened step's workflow, read back: tracked again if it leaves the step
        actionable.  The fold it was judged by; None when the reopening ended meanwhile."""
        judged = self.reopenings.judge(key, history)
        if judged is not None and judged.claims is not None:
            # What was read says the workflow's claims: its next intents are tracked at once.
            self._claims.learn(key[0], judged.claims, judged.partition)
        if judged is not None and judged.step is not None and judged.actionable:
            tracked = Tracked(judged.partition, arrival=judged.arrival)
            self._took(key, tracked, judged.values, judged.state)
            if judged.state.recovery_held_by is not None:
                self._held.took_all(decoded(judged.values), judged.values, judged.partition)
        return None if judged is None else judged.state

    def _took(self, key: StepKey, tracked: Tracked, values: Values, state: WorkflowState) -> None:
        step = state.steps[key[1]]
        tracked.values = values
        tracked.took(step, self._due(state, step, tracked.arrival))
        self.steps[key] = tracked
        self._dirty.add(key)
        self.changed += 1
        self._schedule(key, tracked)

    def _due(
        self, state: WorkflowState, step: StepState, arrival: Arrival | None
    ) -> datetime | None:
        """When the step falls due; never while an operator's pause holds recovery."""
        return None if state.recovery_held_by is not None else self._due_of(step, arrival)

    @staticmethod
    def _moves_waits(before: StepState | None, after: StepState) -> bool:
        """Whether an event begins a wait of its step: only one the fold took does, as only
        it moves the step's ``last_at`` (the fold puts a changed copy).  A late outcome, a
        zombie's intent or an anomaly it refused leaves the running wait (a compensation's
        timeout, a back-off) where it was."""
        return after is not before

    def knows_claims(self, workflow_id: str, partition: int) -> bool:
        """Whether the workflow's latest claim (or that it has none) is known here."""
        return self._claims.known(workflow_id, partition)

    def vouches_claims(self, workflow_id: str, partition: int) -> bool:
        """Whether the workflow's claims are known without an assumed first start: a fold
        a compensation claim may be judged by."""
        return self._claims.vouched(workflow_id, partition)

    def _unfenced(self, state: WorkflowState, event: ev.Event, partition: int) -> bool:
        """An event the fold judges against claims that this fold cannot judge it by.

        A compensation's intent (the claim a hook's effect waits on) needs claims vouched
        for, not assumed: a start read after a take-over may be a competing one, whose
        runner's intents the log fenced off.  Another such event needs them known, for a
        tracked step folded with none (a checkpoint entry that carried none).
        """
        wf = event.workflow_id
        if isinstance(event.body, ev.CompensationIntended):
            return not self.vouches_claims(wf, partition)
        fenced = isinstance(event.body, FENCED) and state.attempt == 0
        return fenced and not self._claims.known(wf, partition)

    def _hold(
        self, key: StepKey, partition: int, event: ev.Event, value: bytes | None, at: Arrived
    ) -> None:
        """Keep a step's event in its reopening: judged once its workflow is read back."""
        self.reopenings.take(key, partition, event, stored(event, value), at)
        self.changed += 1

    def _claimed(self, event: ev.Event, value: bytes | None, partition: int) -> None:
        """Remember a workflow's claim; a resume also reaches the steps already tracked."""
        wf, claim = event.workflow_id, stored(event, value)
        if not self._claims.remember(event, claim, partition=partition):
            return
        self.reopenings.claimed(wf, claim)
        if isinstance(event.body, ev.WorkflowResumed):
            self._reach(event, claim)

    def _steered(self, event: ev.Event, value: bytes | None, partition: int) -> None:
        """A pause (or unpause) of a workflow: kept by its steps whose hold of recovery it
        moves, by its reopened steps, and for the steps tracked while it holds."""
        kept = stored(event, value)
        self._held.took(event, kept, partition)
        self.reopenings.claimed(event.workflow_id, kept)
        self._reach(event, kept, moves_hold)

    def _reach(
        self,
        event: ev.Event,
        value: bytes,
        only: Callable[[WorkflowState, ev.Event], bool] | None = None,
    ) -> None:
        """Fold a workflow's event (a resume, a hold) into its steps already tracked (those
        whose fold ``only`` accepts it for), each judged again by its new fold."""
        wf = event.workflow_id
        for key, tracked in self:
            if key[0] != wf:
                continue
            folded = self._folds.take(key, tracked.values, self._decoder(wf))
            state = folded.fold(wf)
            if event.event_id in state.seen or (only is not None and not only(state, event)):
                continue
            state.apply(event)
            if key[1] not in state.steps:
                self._forget(key, tracked)
                continue
            values = (*tracked.values, value)
            folded.took(values, event)
            self._took(key, tracked, values, state)

    def _new_tracked(self, partition: int, workflow_id: str) -> tuple[Tracked, WorkflowState]:
        claim, held = self._claims.value(workflow_id), self._held.of(workflow_id)
        values = () if claim is None else (claim,)
        events = [] if claim is None else [self._claims.event(workflow_id)]
        if held is not None:
            events, values = [*events, held[0]], (*values, held[1])
        return Tracked(partition, values), replay(workflow_id, events)

    def _decoder(self, workflow_id: str) -> Callable[[Values], list[ev.Event]]:
        return functools.partial(self._claims.decoded, workflow_id)

    def _forget(self, key: StepKey, tracked: Tracked) -> None:
        self._folds.drop(key)
        if self.steps.pop(key, None) is not None:
            self._dirty.discard(key)
            self._check.discard(key)
            self._removed.add((tracked.partition, *key))

    def release(self, key: StepKey, *, echo_offset: int, not_before: datetime | None) -> None:
        """A resolution ended: wait for its echo (or the back-off) before judging again."""
        tracked = self.steps.get(key)
        if tracked is None:
            return
        tracked.busy = False
        tracked.echo_offset = max(tracked.echo_offset, echo_offset)
        tracked.not_before = not_before
        # Nothing it keeps changed, but a step settled while it was busy may go now.
        self._check.add(key)
        self._schedule(key, tracked)

    # -- what is due -------------------------------------------------------------------

    def due(self, now: datetime, limit: int, partitions: set[int]) -> list[StepKey]:
        """Up to ``limit`` due open steps of these partitions that nobody is resolving."""
        found: list[StepKey] = []
        taken: set[StepKey] = set()
        later: list[tuple[datetime, StepKey]] = []
        while self._heap and len(found) < limit and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            tracked = self.steps.get(key)
            if tracked is None or tracked.busy or key in taken:
                continue
            when = self._when(tracked)
            if when is None:
                continue
            if when > now or self._echo_pending(tracked) or tracked.partition not in partitions:
                later.append((max(when, now + timedelta(milliseconds=50)), key))
                continue
            found.append(key)
            taken.add(key)
        for item in later:
            heapq.heappush(self._heap, item)
        return found

    def next_due(self) -> datetime | None:
        """The earliest time something may fall due (a lower bound: entries may be stale)."""
        first = (self._heap[0][0] if self._heap else None, self.reopenings.next_due())
        return min((when for when in first if when is not None), default=None)

    def events_of(self, key: StepKey) -> tuple[ev.Event, ...]:
        """A tracked step's events, decoded (kept decoded a while: it is about to change)."""
        return tuple(self._folds.take(key, self.steps[key].values, self._decoder(key[0])).events)

    def snapshot(self, key: StepKey) -> WorkflowState:
        """A fresh fold of a tracked step's events, independent of the tracker's own."""
        return replay(key[0], list(self.events_of(key)))

    def ready(self, key: StepKey) -> Tracked | None:
        """The tracked step if it may be worked on now (not busy, its echo read)."""
        tracked = self.steps.get(key)
        if tracked is None or tracked.busy or self._echo_pending(tracked):
            return None
        return tracked

    def open_count(self) -> int:
        """Steps with an intent or a compensation and no outcome (those held back until
        their workflow is read included: a held step's own events leave it open)."""
        return sum(1 for t in self.steps.values() if t.status in ACTIONABLE) + len(self.reopenings)

    def oldest_overdue_s(self, now: datetime) -> float:
        """Seconds the most overdue open step is past its deadline (0 when none is); a step
        an operator's pause holds (never due) is left undecided by their choice, not late."""
        late = [
            (now - t.deadline).total_seconds()
            for t in self.steps.values()
            if t.status in ACTIONABLE and t.deadline is not None and t.due is not None
        ]
        return max([0.0, *late])

    def escalated_count(self) -> int:
        """Tracked steps waiting for a human."""
        return sum(1 for t in self.steps.values() if t.escalated)

    def __iter__(self) -> Iterator[tuple[StepKey, Tracked]]:
        return iter(list(self.steps.items()))

    def _when(self, tracked: Tracked) -> datetime | None:
        due = tracked.due
        if due is not None and tracked.not_before is not None:
            due = max(due, tracked.not_before)
        return due

    def _schedule(self, key: StepKey, tracked: Tracked) -> None:
        when = self._when(tracked)
        if when is not None:
            heapq.heappush(self._heap, (when, key))

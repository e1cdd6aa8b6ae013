"""The daemon's memory: only the steps it may still have to act on, never all history.

A step is tracked from its intent (read-only intents are skipped) while it is open (an
intent or a compensation with no outcome), while it waits in the human queue, and for a
retention window after recovery or a human decided it (so a late outcome from a slow agent
can still be judged).  A step an agent settled itself is dropped at once.  Each tracked
step holds its own events and the fold of them, so the log order decides, as for every
other reader.  No I/O here: the daemon feeds events in and takes checkpoint batches out.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, Source
from stepledger.domain.resolution import ACTIONABLE
from stepledger.domain.state import StepState, StepStatus, WorkflowState, replay
from stepledger.domain.times import later
from stepledger.errors import RecoveryError
from stepledger.recovery.checkpoint import CheckpointBatch, PartitionCheckpoint, decode_events

StepKey = tuple[str, str]
DueFn = Callable[[StepState], datetime | None]
#: Anomaly kinds of an outcome that arrived after the step was decided.
LATE_OUTCOME_KINDS = frozenset({"late_outcome", "second_outcome", "stale_outcome"})
#: How many workflows' latest claims are remembered, so a step tracked from its intent is
#: folded with the claim before it and a zombie's intent (fenced off) is never tracked.
CLAIMS_KEPT = 100_000
_CLAIMS = (ev.WorkflowStarted, ev.WorkflowResumed)


@dataclass(slots=True)
class Tracked:
    """One tracked step: its partition, its events and the fold of them."""

    partition: int
    state: WorkflowState
    events: list[str] = field(default_factory=list)
    """The step's events as JSON (a third of the decoded objects' memory)."""
    busy: bool = False
    """A resolution of it is running on a worker."""
    echo_offset: int = -1
    """The last offset a resolution appended; it is not judged again before reading it."""
    not_before: datetime | None = None
    """Local back-off after a resolution that could not append its events."""
    anchor: datetime | None = None
    """The intent's deadline plus grace re-anchored on this daemon's clock (see recovery.clock)."""

    @property
    def step(self) -> StepState:
        """The step's state (the one step this state holds)."""
        for step in self.state.steps.values():
            return step
        raise RecoveryError("a tracked step with no state", workflow_id=self.state.workflow_id)

    def snapshot(self) -> WorkflowState:
        """A fresh fold of the step's events, for a worker to resolve on."""
        return snapshot(self.state.workflow_id, self.events)


@dataclass(frozen=True)
class LateOutcome:
    """An outcome the fold refused because the step was already decided: to be judged."""

    key: StepKey
    event: ev.Event


class Tracker:
    """Tracked steps by (workflow, step), with a due-time heap and a checkpoint diff."""

    def __init__(self, due: DueFn, *, retain: timedelta = timedelta(hours=24)) -> None:
        self._due_of = due
        self.retain = retain
        self.steps: dict[StepKey, Tracked] = {}
        self.positions: dict[int, int] = {}
        self._heap: list[tuple[datetime, StepKey]] = []
        self._dirty: set[StepKey] = set()
        self._removed: set[tuple[int, str, str]] = set()
        self._moved: set[int] = set()
        self.unloadable: list[tuple[StepKey, str]] = []
        """Checkpoint entries that could not be loaded (skipped), for the daemon to report."""
        self.late: list[LateOutcome] = []
        """Late outcomes found in loaded checkpoints, for the daemon to judge (or skip)."""
        self._claims: OrderedDict[str, tuple[ev.Event, str]] = OrderedDict()

    # -- partitions --------------------------------------------------------------------

    def load(self, partition: int, checkpoint: PartitionCheckpoint | None) -> int | None:
        """Take over a partition from its checkpoint; return the offset to resume at."""
        self.drop_partition(partition)
        if checkpoint is None:
            # Saved at once as "nothing read yet", so the next owner resumes from a
            # checkpoint even when this daemon reads nothing before it loses the partition.
            self.positions[partition] = 0
            self._moved.add(partition)
            return None
        for (wf, step_id), events in checkpoint.steps.items():
            try:
                decoded = decode_events(events)
                tracked = Tracked(partition, replay(wf, decoded), list(events))
                for event in decoded:
                    if isinstance(event.body, _CLAIMS):
                        # The claims a tracked step was folded with survive a restart.
                        self._remember(event)
                if step_id in tracked.state.steps:
                    self.steps[(wf, step_id)] = tracked
                    self._schedule((wf, step_id), tracked)
                    self._late_in_checkpoint((wf, step_id), tracked, decoded)
            except Exception as exc:
                # One bad entry never stops the take-over: the step is re-read from the log
                # the next time one of its events arrives, and the daemon reports it.
                self.steps.pop((wf, step_id), None)
                self.unloadable.append(((wf, step_id), f"{type(exc).__name__}: {exc}"))
        self.positions[partition] = checkpoint.next_offset
        return checkpoint.next_offset

    def _late_in_checkpoint(self, key: StepKey, tracked: Tracked, events: list[ev.Event]) -> None:
        # A late outcome read before a crash but not judged yet must still be judged.
        late_ids = {a.event_id for a in tracked.state.anomalies if a.kind in LATE_OUTCOME_KINDS}
        self.late.extend(LateOutcome(key, e) for e in events if e.event_id in late_ids)

    def drop_partition(self, partition: int) -> None:
        """Forget a partition (revoked): its steps are another daemon's now."""
        for key in [k for k, t in self.steps.items() if t.partition == partition]:
            del self.steps[key]
            self._dirty.discard(key)
        self._removed = {r for r in self._removed if r[0] != partition}
        self.positions.pop(partition, None)
        self._moved.discard(partition)

    def partitions(self) -> set[int]:
        """The partitions whose positions are known."""
        return set(self.positions)

    # -- events ------------------------------------------------------------------------

    def apply(self, event: ev.Event, partition: int, offset: int) -> LateOutcome | None:
        """Fold one consumed event in; return a late outcome if one needs judging."""
        self.positions[partition] = offset + 1
        self._moved.add(partition)
        if event.step_id is None:
            if isinstance(event.body, _CLAIMS):
                self._claimed(event)
            return None
        key = (event.workflow_id, event.step_id)
        tracked = self.steps.get(key)
        if tracked is None:
            body = event.body
            if not isinstance(body, ev.StepIntended) or body.effect is EffectClass.READ_ONLY:
                return None
            tracked = self._new_tracked(partition, event.workflow_id)
        elif event.event_id in tracked.state.seen:
            return None
        tracked.events.append(event.model_dump_json())
        anomaly = tracked.state.apply(event)
        if event.step_id not in tracked.state.steps:
            # An intent the fold refused, or the step's workflow started over (a read-only
            # restart carrying the step's id): nothing to track, whatever was tracked before.
            self._forget(key, tracked)
            return None
        self.steps[key] = tracked
        self._dirty.add(key)
        self._schedule(key, tracked)
        if anomaly is not None and anomaly.kind in LATE_OUTCOME_KINDS:
            return LateOutcome(key, event)
        return None

    def anchor(self, key: StepKey, when: datetime) -> None:
        """Let the step fall due no earlier than ``when`` (its deadline on this daemon's clock)."""
        tracked = self.steps.get(key)
        if tracked is not None:
            tracked.anchor = when
            self._schedule(key, tracked)

    def _claimed(self, event: ev.Event) -> None:
        """Remember a workflow's claim; a resume also reaches the steps already tracked."""
        wf = event.workflow_id
        if not self._remember(event):
            return
        if isinstance(event.body, ev.WorkflowResumed):
            for key, tracked in self:
                if key[0] == wf and event.event_id not in tracked.state.seen:
                    tracked.events.append(self._claims[wf][1])
                    tracked.state.apply(event)
                    self._dirty.add(key)

    def _remember(self, event: ev.Event) -> bool:
        """Keep the claim as its workflow's latest; False for a stale or competing one."""
        wf = event.workflow_id
        known = self._claims.get(wf)
        if known is not None:
            if known[0].event_id == event.event_id:
                return False
            probe = replay(wf, [known[0]])
            if probe.apply(event) is not None:
                return False  # a stale or competing claim owns nothing
        self._claims[wf] = (event, event.model_dump_json())
        self._claims.move_to_end(wf)
        while len(self._claims) > CLAIMS_KEPT:
            self._claims.popitem(last=False)
        return True

    def _new_tracked(self, partition: int, workflow_id: str) -> Tracked:
        claim = self._claims.get(workflow_id)
        if claim is None:
            return Tracked(partition, WorkflowState(workflow_id))
        return Tracked(partition, replay(workflow_id, [claim[0]]), [claim[1]])

    def _forget(self, key: StepKey, tracked: Tracked) -> None:
        if self.steps.pop(key, None) is not None:
            self._dirty.discard(key)
            self._removed.add((tracked.partition, *key))

    def release(self, key: StepKey, *, echo_offset: int, not_before: datetime | None) -> None:
        """A resolution ended: wait for its echo (or the back-off) before judging again."""
        tracked = self.steps.get(key)
        if tracked is None:
            return
        tracked.busy = False
        tracked.echo_offset = max(tracked.echo_offset, echo_offset)
        tracked.not_before = not_before
        self._dirty.add(key)
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
        return self._heap[0][0] if self._heap else None

    def ready(self, key: StepKey) -> Tracked | None:
        """The tracked step if it may be worked on now (not busy, its echo read)."""
        tracked = self.steps.get(key)
        if tracked is None or tracked.busy or self._echo_pending(tracked):
            return None
        return tracked

    def open_count(self) -> int:
        """Steps with an intent or a compensation and no outcome."""
        return sum(1 for t in self.steps.values() if t.step.status in ACTIONABLE)

    def oldest_overdue_s(self, now: datetime) -> float:
        """Seconds the most overdue open step is past its deadline (0 when none is)."""
        late = [
            (now - t.step.deadline).total_seconds()
            for t in self.steps.values()
            if t.step.status in ACTIONABLE and t.step.deadline is not None
        ]
        return max([0.0, *late])

    def escalated_count(self) -> int:
        """Tracked steps waiting for a human."""
        return sum(1 for t in self.steps.values() if _escalated(t.step))

    def __iter__(self) -> Iterator[tuple[StepKey, Tracked]]:
        return iter(list(self.steps.items()))

    # -- checkpoints -------------------------------------------------------------------

    def take_batch(
        self,
        now: datetime,
        *,
        sweep: bool = False,
        writable: Callable[[int], bool] = lambda partition: True,
    ) -> CheckpointBatch:
        """Drop what needs no tracking and return everything changed since the last batch.

        Changed steps are checked every time; ``sweep`` also expires retained decisions.
        Changes of a partition that is not ``writable`` (its ownership in doubt) stay
        pending: written by a later batch once it is, or dropped with the partition.
        """
        for key in list(self.steps) if sweep else list(self._dirty):
            tracked = self.steps.get(key)
            if tracked is not None and not tracked.busy and not self._keep(tracked.step, now):
                del self.steps[key]
                self._dirty.discard(key)
                self._removed.add((tracked.partition, *key))
        moved = {p for p in self._moved if writable(p)}
        batch = CheckpointBatch(positions={p: self.positions[p] for p in moved})
        held: set[StepKey] = set()
        for key in self._dirty:
            tracked = self.steps.get(key)
            if tracked is None:
                continue
            if writable(tracked.partition):
                batch.upserts[(tracked.partition, *key)] = list(tracked.events)
            else:
                held.add(key)
        batch.deletes = {r for r in self._removed if writable(r[0])}
        self._dirty = held
        self._removed -= batch.deletes
        self._moved -= moved
        return batch

    def _keep(self, step: StepState, now: datetime) -> bool:
        if step.status in ACTIONABLE or _escalated(step):
            return True
        by = step.resolved_by
        if by is None or by is Source.AGENT or step.resolved_at is None:
            return False
        # Decided by recovery or a human: a slow agent's outcome may still come.
        return now < later(step.resolved_at, self.retain)

    def _when(self, tracked: Tracked) -> datetime | None:
        due = self._due_of(tracked.step)
        if due is not None and tracked.not_before is not None:
            due = max(due, tracked.not_before)
        if due is not None and tracked.anchor is not None and tracked.step.in_doubt:
            due = max(due, tracked.anchor)
        return due

    def _schedule(self, key: StepKey, tracked: Tracked) -> None:
        when = self._when(tracked)
        if when is not None:
            heapq.heappush(self._heap, (when, key))

    def _echo_pending(self, tracked: Tracked) -> bool:
        return self.positions.get(tracked.partition, 0) <= tracked.echo_offset


def snapshot(workflow_id: str, events: list[str]) -> WorkflowState:
    """A fresh fold of a tracked step's events (JSON), independent of the daemon's copy."""
    return replay(workflow_id, decode_events(events))


def _escalated(step: StepState) -> bool:
    return step.status is StepStatus.ABANDONED or step.escalation_open

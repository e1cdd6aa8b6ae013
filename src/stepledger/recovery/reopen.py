"""Steps the tracker holds back until their workflow is read: reopened, then judged by a read.

The tracker drops a step once its agent settled it (an outcome recorded by the agent), so
it never holds a workflow's whole history.  A saga's unwinding may later record
``compensation_intended`` for such a step (it succeeded; the agent now undoes it): if the
agent dies before ``compensation_outcome`` and nobody resumes the workflow, the step stays
``compensating``, and only the daemon can carry the compensation through.  So an event
for a step the tracker does not hold *reopens* it when it may leave the step actionable
(:func:`reopens`).  Of the step events, only a compensation's intent can: an outcome or a
verdict settles a step (``happened``, ``not_happened``, ``compensated``), an approval's
decision leaves it approved or denied (the intent that follows it starts tracking as every
intent does), and an abandonment waits for a person.

The same holds a step whose workflow's claims the tracker does not know (a partition taken
over from a checkpoint, a head deleted, a claim forgotten to stay within its bound): its
intent (or any event the log's fold judges against the claims, :data:`FENCED`) is held here
instead of being tracked, since a zombie's intent, fenced off by a claim the tracker never
read, would look live.  One mechanism for both: what the tracker lacks is in the log.

A reopened step is not tracked at once: its intent (arguments, key, tool), its result
and its workflow's claims are not in what the daemon read since.  It keeps the events read
since it reopened (its own and its workflow's claims) and falls due at its own deadline plus
the grace, by one clock: the timeout of its latest intent or compensation (the recorded
``deadline`` less its ``occurred_at``) after it reached the daemon (``recovery.clock``), as
a tracked step falls due.  Most never do: the agent records the outcome first, which ends
the reopening without a read (:func:`ends`, or a fold of what it holds that leaves the step
settled).  A due one has its workflow read back through the daemon's workflow reader (off
the loop); the fold of what was read plus what arrived since (:func:`history_of`) says
whether the step is actionable, and only then is it tracked (a zombie's intent or
compensation, fenced off by a newer claim, leaves the step settled: it is not); the read
also teaches the tracker the workflow's claims (:func:`claims_read`).  A reopening is
checkpointed like a tracked step (its events as lines, which tell it apart on load: the
reopening event first, or no claim of the workflow before its first step event), so a
restart or a moved partition loses none.  No I/O here.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.resolution import ACTIONABLE, Arrival
from stepledger.domain.state import StepState, WorkflowState, replay
from stepledger.domain.times import later
from stepledger.recovery.checkpoint import StepKey
from stepledger.recovery.holds import HOLDS
from stepledger.recovery.tracked import Values, decoded, json_lines, stored

#: A workflow's claims: the events besides its own that a tracked step is folded with.
CLAIMS = (ev.WorkflowStarted, ev.WorkflowResumed)
#: The workflow's events a tracked step keeps beside its own.
_KEPT = (*CLAIMS, *HOLDS)
#: Step events the log's fold judges against the workflow's claims (a zombie's decides nothing).
FENCED = (ev.StepIntended, ev.CompensationIntended)


def reopens(event: ev.Event) -> bool:
    """Whether an event for a step the tracker does not hold may leave it actionable."""
    return type(event.body) is ev.CompensationIntended


def ends(event: ev.Event) -> bool:
    """Whether an event read after a reopening ends it unread (the compensation ended)."""
    return type(event.body) is ev.CompensationOutcome


def settled(step_id: str, events: Sequence[ev.Event]) -> bool:
    """Whether the fold of a held step's events leaves it settled (its intent among them).

    Knowing the workflow's claims only fences events off (a zombie's intent or compensation),
    and the writer of an outcome read its own intent back first: a step that these events
    settle is settled in the log too, so its reopening ends unread.
    """
    step = _step(step_id, events)
    return step is not None and step.status not in ACTIONABLE


def _step(step_id: str, events: Sequence[ev.Event]) -> StepState | None:
    return replay(events[0].workflow_id, list(events)).steps.get(step_id) if events else None


def history_of(
    step_id: str, history: Sequence[ev.Event], since: Sequence[ev.Event]
) -> list[ev.Event]:
    """The events a step is tracked with: its workflow's claims, pauses (a hold of recovery)
    and its own, in log order.

    ``history`` is the workflow read back after the reopening event was read, so it holds
    everything before that event; ``since`` are the events read since the reopening (that
    one first), some read back too.  Those the read did not reach came after its end.
    """
    kept = [e for e in history if e.step_id == step_id or isinstance(e.body, _KEPT)]
    seen = {e.event_id for e in kept}
    return kept + [e for e in since if e.event_id not in seen]


def claims_read(history: Sequence[ev.Event], since: Sequence[ev.Event]) -> list[ev.Event] | None:
    """The workflow's claims up to what the daemon has read, in log order: those the read
    found before the reopening event, then those read since (None: the read lacks it).

    Claims the read found after the reopening event and the loop has not read yet are left
    out: the tracker takes them in when it reads them, in their place in the log.
    """
    first = since[0].event_id if since else None
    index = next((i for i, e in enumerate(history) if e.event_id == first), None)
    if index is None:
        return None
    found = [e for e in [*history[:index], *since] if isinstance(e.body, CLAIMS)]
    return list({e.event_id: e for e in found}.values())


def read_at(event: ev.Event, arrived: datetime | None, grace: timedelta) -> datetime | None:
    """When an intent or a compensation's intent falls due: its timeout after it reached the
    daemon, plus the grace (by its recorded deadline when its arrival is not known); None
    for others."""
    body = event.body
    if not isinstance(body, FENCED):
        return None
    if arrived is None:
        return later(body.deadline, grace)
    return later(later(arrived, body.deadline - event.occurred_at), grace)


@dataclass(frozen=True, slots=True)
class Judged:
    """A reopened step's workflow read back: the step as the log has it, and what to track."""

    partition: int
    state: WorkflowState
    """The fold of the step's events (its workflow's claims and its own)."""
    values: Values
    """Those events, as a tracked step keeps them."""
    arrival: Arrival | None
    """When its latest intent and its last event reached the daemon (an intent read before
    the reopening: not known)."""
    claims: tuple[tuple[ev.Event, bytes], ...] | None = None
    """The workflow's claims up to what the daemon read, with their values (None: unknown)."""

    @property
    def step(self) -> StepState | None:
        """The step, if the fold holds it."""
        return next(iter(self.state.steps.values()), None)

    @property
    def actionable(self) -> bool:
        """The step is in doubt or compensating: it is tracked again."""
        step = self.step
        return step is not None and step.status in ACTIONABLE


@dataclass(slots=True, eq=False)
class Reopening:
    """A step reopened by an event: the events read since, and when its history is read."""

    partition: int
    due: datetime
    """When its workflow is read back (its compensation's deadline plus the grace)."""
    values: Values = ()
    """The events read since it reopened (that one first), as stored values."""
    arrived: datetime | None = None
    """When its last event reached the daemon, on the daemon's clock (None: not known)."""
    intent: datetime | None = None
    """When the latest intent among them reached the daemon (None: none, or not known)."""
    busy: bool = False
    """Its workflow is being read back."""
    failures: int = 0
    """Reads of its workflow that failed."""
    not_before: datetime | None = None
    """The back-off after a failed read."""

    @property
    def when(self) -> datetime:
        """When it may be read, back-off included."""
        return self.due if self.not_before is None else max(self.due, self.not_before)


@dataclass
class Reopenings:
    """The reopened steps by (workflow, step), a due-time heap and a checkpoint diff."""

    grace: timedelta = timedelta(0)
    steps: dict[StepKey, Reopening] = field(default_factory=dict)
    _of_workflow: dict[str, set[str]] = field(default_factory=dict)
    _heap: list[tuple[datetime, StepKey]] = field(default_factory=list)
    _dirty: set[StepKey] = field(default_factory=set)
    _removed: set[tuple[int, str, str]] = field(default_factory=set)

    def get(self, key: StepKey) -> Reopening | None:
        """The step's reopening, if it has one."""
        return self.steps.get(key)

    def take(
        self, key: StepKey, partition: int, event: ev.Event, value: bytes, arrived: datetime | None
    ) -> None:
        """An event of a step let go of: it reopens the step, or joins (or ends) its reopening.

        ``arrived``: when it reached the daemon, on the daemon's clock (None: not known).
        """
        due = read_at(event, arrived, self.grace)
        intent = arrived if isinstance(event.body, ev.StepIntended) else None
        reopening = self.steps.get(key)
        if reopening is None:
            assert due is not None  # only an intent or a compensation's opens (see FENCED)
            self._put(key, Reopening(partition, due, (value,), arrived, intent))
            return
        if ends(event):
            self.pop(key)
            return
        reopening.values, reopening.arrived = (*reopening.values, value), arrived
        reopening.intent = intent or reopening.intent
        if event.step_id is not None and settled(key[1], decoded(reopening.values)):
            self.pop(key)
            return
        self._dirty.add(key)
        if due is not None and due > reopening.due:
            reopening.due = due
            heapq.heappush(self._heap, (due, key))

    def restore(
        self,
        partition: int,
        key: StepKey,
        events: list[ev.Event],
        values: Values,
        now: datetime | None,
    ) -> bool:
        """Take a checkpointed reopening back (False: the entry is a tracked step's).

        A reopening's first step event is the one that reopened it; a tracked step's is
        its intent (or the approval asked for it), after its workflow's claims.  An entry
        with no claim before its first step event does not say the workflow's claims: if
        its step is actionable it is held as well, and read back before it is decided.  A
        checkpoint keeps no arrivals: its events count as arrived ``now`` (the take-over),
        so it is read no earlier (None: by the recorded deadlines).
        """
        index = next((i for i, e in enumerate(events) if e.step_id is not None), None)
        if index is None:
            return False
        unclaimed = not any(isinstance(e.body, CLAIMS) for e in events[:index])
        step = _step(key[1], events)
        held = unclaimed and step is not None and step.status in ACTIONABLE
        dues = [when for e in events if (when := read_at(e, now, self.grace)) is not None]
        if not dues or not (reopens(events[index]) or held):
            return False
        intent = now if any(isinstance(e.body, ev.StepIntended) for e in events) else None
        self._put(key, Reopening(partition, max(dues), values, now, intent), dirty=False)
        return True

    def judge(self, key: StepKey, history: Sequence[ev.Event]) -> Judged | None:
        """End a reopening whose workflow was read back: the step as the log has it.

        None when the reopening ended meanwhile, or is not the one this read was for (its
        partition moved away and back).
        """
        reopening = self.steps.get(key)
        if reopening is None or not reopening.busy:
            return None
        self.pop(key)
        since = decoded(reopening.values)
        events = history_of(key[1], history, since)
        values = tuple(stored(event) for event in events)
        arrival = None
        if reopening.arrived is not None:
            arrival = Arrival(reopening.intent, reopening.arrived)
        claims = claims_read(history, since)
        known = None if claims is None else tuple((e, stored(e)) for e in claims)
        return Judged(reopening.partition, replay(key[0], events), values, arrival, known)

    def claimed(self, workflow_id: str, value: bytes) -> None:
        """A claim (or a pause) of the workflow: kept by each of its reopened steps."""
        for step_id in self._of_workflow.get(workflow_id, ()):
            key = (workflow_id, step_id)
            self.steps[key].values = (*self.steps[key].values, value)
            self._dirty.add(key)

    def pop(self, key: StepKey) -> Reopening | None:
        """End a reopening (read back, or settled meanwhile); its checkpoint entry goes."""
        reopening = self.steps.pop(key, None)
        if reopening is None:
            return None
        self._unindex(key)
        self._dirty.discard(key)
        self._removed.add((reopening.partition, *key))
        return reopening

    def failed(self, key: StepKey, not_before: datetime) -> int:
        """A read of the step's workflow failed: try again after ``not_before``; the count."""
        reopening = self.steps[key]
        reopening.busy, reopening.not_before = False, not_before
        reopening.failures += 1
        heapq.heappush(self._heap, (reopening.when, key))
        return reopening.failures

    def due(self, now: datetime, limit: int, partitions: set[int]) -> list[StepKey]:
        """Up to ``limit`` reopened steps whose workflow may be read now (marked busy)."""
        found: list[StepKey] = []
        held: list[tuple[datetime, StepKey]] = []
        while self._heap and len(found) < limit and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            reopening = self.steps.get(key)
            if reopening is None or reopening.busy:
                continue
            if reopening.when > now:
                continue  # pushed again with its later time
            if reopening.partition not in partitions:
                held.append((now + timedelta(milliseconds=50), key))
                continue
            reopening.busy = True
            found.append(key)
        for item in held:
            heapq.heappush(self._heap, item)
        return found

    def next_due(self) -> datetime | None:
        """The earliest time a read may fall due (a lower bound: entries may be stale)."""
        return self._heap[0][0] if self._heap else None

    def drop_partition(self, partition: int) -> None:
        """Forget a partition's reopenings (its next owner loads them from the checkpoint)."""
        for key in [k for k, r in self.steps.items() if r.partition == partition]:
            del self.steps[key]
            self._unindex(key)
            self._dirty.discard(key)
        self._removed = {r for r in self._removed if r[0] != partition}

    def batch(
        self,
        upserts: dict[tuple[int, str, str], list[str]],
        deletes: set[tuple[int, str, str]],
        writable: Callable[[int], bool],
    ) -> None:
        """Add the changes of writable partitions to a checkpoint batch (the rest wait)."""
        for key in [k for k in self._dirty if writable(self.steps[k].partition)]:
            reopening = self.steps[key]
            upserts[(reopening.partition, *key)] = json_lines(reopening.values)
            self._dirty.discard(key)
        gone = {r for r in self._removed if writable(r[0])}
        deletes.update(gone)
        self._removed -= gone

    def __iter__(self) -> Iterator[tuple[StepKey, Reopening]]:
        return iter(list(self.steps.items()))

    def __len__(self) -> int:
        return len(self.steps)

    def _put(self, key: StepKey, reopening: Reopening, *, dirty: bool = True) -> None:
        self.steps[key] = reopening
        self._of_workflow.setdefault(key[0], set()).add(key[1])
        heapq.heappush(self._heap, (reopening.due, key))
        if dirty:
            self._dirty.add(key)
        self._removed.discard((reopening.partition, *key))

    def _unindex(self, key: StepKey) -> None:
        steps = self._of_workflow.get(key[0])
        if steps is not None:
            steps.discard(key[1])
            if not steps:
                del self._of_workflow[key[0]]

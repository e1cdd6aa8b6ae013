"""One step in the recovery daemon's memory: its events as encoded, and what the fold said.

A tracked step keeps its events only as Avro values (single-object framing, no registry,
so they decode the same after any restart): the value the event was read as when it is in
that framing, else the event encoded again.  That is the only copy of them.  Between two
events the tracker decides on what the last fold of them said (status, due time, deadline,
whether a decision is retained); the fold itself (``domain.state``, the one every reader
uses) is run again from the values when a new event arrives or when a worker resolves the
step.  A checkpoint writes the values as JSON lines when it is taken (``Codec.to_json``),
not as the step changes.  Keeping the fold (a ``WorkflowState`` with its ``StepState`` and
``seen`` set) and a JSON copy per step cost about three times the memory per open intent.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from stepledger.codec import Codec
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.resolution import Arrival, arrived, deadline_on
from stepledger.domain.state import StepState, StepStatus, WorkflowState, replay
from stepledger.errors import RecoveryError
from stepledger.recovery.checkpoint import StepKey

#: A tracked step's events in log order, as Avro values (see :func:`stored`).
Values = tuple[bytes, ...]
#: Anomaly kinds of an outcome that arrived after the step was decided.
LATE_OUTCOME_KINDS = frozenset({"late_outcome", "second_outcome", "stale_outcome"})
#: How many steps handed to a worker (or changed) lately keep their events decoded: a bound
#: well above the resolutions in flight, which are dropped once checkpointed and read back.
FOLDS_KEPT = 4096


@functools.cache
def own_codec() -> Codec:
    """The codec of stored values: the current schema, single-object framing, no registry."""
    return Codec()


def stored(event: ev.Event, value: bytes | None = None) -> bytes:
    """The bytes kept for ``event``: ``value`` (as read) when in the stored framing."""
    codec = own_codec()
    if value is not None and value.startswith(codec.prefix):
        return value
    return codec.encode(event)


def decoded(values: Iterable[bytes]) -> list[ev.Event]:
    """The events of stored values."""
    decode = own_codec().decode
    return [decode(value) for value in values]


def json_lines(values: Iterable[bytes]) -> list[str]:
    """A tracked step's events as checkpoint lines (one JSON event each)."""
    to_json = own_codec().to_json
    return [to_json(value) for value in values]


@dataclass(frozen=True)
class LateOutcome:
    """An outcome the fold refused because the step was already decided: to be judged."""

    key: StepKey
    event: ev.Event


@dataclass(slots=True, eq=False)
class Tracked:
    """One tracked step: its partition, its events as values and what their fold said."""

    partition: int
    values: Values = ()
    """The step's events (the workflow's claim first, when one was known), as Avro values."""
    status: StepStatus = StepStatus.INTENDED
    due: datetime | None = None
    """When recovery may act on it, on this daemon's clock (before the local back-off)."""
    deadline: datetime | None = None
    """The intent's deadline on this daemon's clock (see ``arrival``)."""
    resolved_by: Source | None = None
    resolved_at: datetime | None = None
    escalation_open: bool = False
    busy: bool = False
    """A resolution of it is running on a worker."""
    echo_offset: int = -1
    """The last offset a resolution appended; it is not judged again before reading it."""
    not_before: datetime | None = None
    """Local back-off after a resolution that could not append its events."""
    arrival: Arrival | None = None
    """When the step's events reached this daemon, on its clock (see recovery.clock); None
    leaves the due time to the writers' recorded times."""

    def arrived(self, event: ev.Event, at: datetime | None) -> None:
        """One more event of the step reached the daemon ``at`` (None: when is not known).

        An event whose arrival is not known leaves none known (``domain.resolution.arrived``,
        the rule a resuming agent goes by too).
        """
        self.arrival = arrived(self.arrival, event, at)

    def took(self, step: StepState, due: datetime | None) -> None:
        """Keep what the tracker decides by from the step's new fold."""
        self.status, self.due = step.status, due
        self.deadline = deadline_on(step, self.arrival)
        self.resolved_by, self.resolved_at = step.resolved_by, step.resolved_at
        self.escalation_open = step.escalation_open

    @property
    def in_doubt(self) -> bool:
        """An intent with no outcome."""
        return self.status is StepStatus.INTENDED

    @property
    def escalated(self) -> bool:
        """Waiting for a human."""
        return self.status is StepStatus.ABANDONED or self.escalation_open

    @property
    def state(self) -> WorkflowState:
        """A fresh fold of the step's events (decodes them: for tests and debugging; the
        tracker folds through its cache)."""
        return _fold_values(self.values)

    @property
    def step(self) -> StepState:
        """The step's state from a fresh fold (the one step the fold holds)."""
        return only_step(self.state)

    @property
    def events(self) -> list[str]:
        """The step's events as JSON lines, as a checkpoint stores them."""
        return json_lines(self.values)


def only_step(state: WorkflowState) -> StepState:
    """The one step a tracked step's fold holds."""
    for step in state.steps.values():
        return step
    raise RecoveryError("a tracked step with no state", workflow_id=state.workflow_id)


def _fold_values(values: Sequence[bytes]) -> WorkflowState:
    events = decoded(values)
    if not events:
        raise RecoveryError("a tracked step with no events")
    return replay(events[0].workflow_id, events)


@dataclass(slots=True, eq=False)
class Folded:
    """A tracked step's events decoded, and their fold, for as long as its values are these."""

    values: Values
    events: list[ev.Event]
    state: WorkflowState | None = None
    """The fold of ``events`` (built on first use); only the tracker's thread touches it."""

    def fold(self, workflow_id: str) -> WorkflowState:
        """The fold of the events (kept: the tracker applies the next event to it)."""
        if self.state is None:
            self.state = replay(workflow_id, self.events)
        return self.state

    def took(self, values: Values, event: ev.Event) -> None:
        """One more event, already applied to the fold."""
        self.values, self.events = values, [*self.events, event]


class FoldCache:
    """The decoded events and folds of the steps that changed or were handed out lately.

    A step handed to a worker is read back within milliseconds (its resolution's events):
    its echo is folded, and the checkpoint writes it, without decoding its events again.
    Bounded (least recently used first out); a step whose values changed since is decoded
    afresh.  Steps that only arrived (new intents) are never kept here.
    """

    def __init__(self, size: int = FOLDS_KEPT) -> None:
        self.size = size
        self._entries: OrderedDict[StepKey, Folded] = OrderedDict()

    def get(self, key: StepKey, values: Values) -> Folded | None:
        """The step's decoded events if they are still these ``values``."""
        folded = self._entries.get(key)
        return folded if folded is not None and folded.values is values else None

    def take(
        self, key: StepKey, values: Values, decode: Callable[[Values], list[ev.Event]] = decoded
    ) -> Folded:
        """The step's decoded events (decoded now if need be), kept as recently used."""
        folded = self.get(key, values)
        if folded is None:
            folded = Folded(values, decode(values))
        self._entries[key] = folded
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return folded

    def drop(self, key: StepKey) -> None:
        """Forget a step (no longer tracked)."""
        self._entries.pop(key, None)

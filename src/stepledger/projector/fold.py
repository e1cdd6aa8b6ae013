"""Batch folding: events into per-workflow fold states, and fold states into table rows.

Pure: imports only the domain.  Step and workflow status come from
:mod:`stepledger.domain.state` (the one state machine); this module adds only what the
tables need beyond it (escalation records, change tracking) and turns states into rows.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.state import Anomaly, RunStatus, StepState, StepStatus, WorkflowState

Columns = dict[str, list[Any]]
Coordinates = tuple[str, int, int]
"""Where a record was read: (topic, partition, offset)."""

_STEP_STATUSES = tuple(s.value for s in StepStatus)


@dataclass
class Escalation:
    """An escalation as the log tells it: opened by an abandonment or a dead letter."""

    escalation_id: str
    kind: str
    step_id: str | None
    reason: str
    opened_at: datetime
    verdict: str | None = None
    resolved_by: str | None = None
    note: str | None = None
    resolved_at: datetime | None = None


class WorkflowProjection:
    """One workflow's fold state, plus the escalations and event count the tables show."""

    __slots__ = ("escalations", "events", "state")

    def __init__(self, workflow_id: str) -> None:
        self.state = WorkflowState(workflow_id)
        self.escalations: dict[str, Escalation] = {}
        self.events = 0

    def is_duplicate(self, event: ev.Event) -> bool:
        """True when this event (by id) was already folded in."""
        return event.event_id in self.state.seen

    def apply(self, event: ev.Event) -> Anomaly | None:
        """Fold a new event in; return the anomaly it caused, if any."""
        anomaly = self.state.apply(event)
        self.events += 1
        if anomaly is None:
            self._track_escalation(event)
        return anomaly

    def _track_escalation(self, event: ev.Event) -> None:
        body, at = event.body, event.occurred_at
        if isinstance(body, ev.StepAbandoned) and body.escalation_id is not None:
            self.escalations[body.escalation_id] = Escalation(
                body.escalation_id, "step", event.step_id, body.reason, at
            )
        elif isinstance(body, ev.WorkflowDeadLettered):
            self.escalations[body.escalation_id] = Escalation(
                body.escalation_id, "workflow", None, body.reason, at
            )
        elif isinstance(body, ev.EscalationResolved):
            known = self.escalations.get(body.escalation_id)
            if known is not None:
                known.verdict, known.resolved_by = body.verdict.value, body.by
                known.note, known.resolved_at = body.note, at

    def escalation_status(self, esc: Escalation) -> str:
        """``open`` while the fold holds it, ``resolved`` once answered, else ``superseded``."""
        state = self.state
        if esc.kind == "workflow":
            is_open = (
                state.status is RunStatus.DEAD_LETTERED and state.escalation_id == esc.escalation_id
            )
        else:
            step = state.steps.get(esc.step_id or "")
            is_open = (
                step is not None
                and step.escalation_open
                and step.escalation_id == esc.escalation_id
            )
        if is_open:
            return "open"
        return "resolved" if esc.verdict is not None else "superseded"


class WorkflowCache:
    """A bounded LRU of workflow projections; evicted ones are rebuilt from stored events."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._items: OrderedDict[str, WorkflowProjection] = OrderedDict()

    def __contains__(self, workflow_id: object) -> bool:
        return workflow_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, workflow_id: str) -> WorkflowProjection:
        """Return a cached projection (marking it recently used)."""
        self._items.move_to_end(workflow_id)
        return self._items[workflow_id]

    def put(self, projection: WorkflowProjection) -> None:
        """Add a projection."""
        self._items[projection.state.workflow_id] = projection

    def missing(self, workflow_ids: Iterable[str]) -> list[str]:
        """The ids of the given workflows that are not cached, each once."""
        return [w for w in dict.fromkeys(workflow_ids) if w not in self._items]

    def discard(self, workflow_ids: Iterable[str]) -> None:
        """Forget these workflows (their stored rows are the truth again)."""
        for workflow_id in workflow_ids:
            self._items.pop(workflow_id, None)

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()

    def trim(self, keep: frozenset[str] = frozenset()) -> None:
        """Evict least recently used projections beyond the capacity, never those in keep.

        ``keep`` holds the workflows of a batch whose commit is still running: their stored
        events are incomplete, so they could not be rebuilt from the store yet.
        """
        excess = len(self._items) - self.capacity
        if excess <= 0:
            return
        oldest = islice(self._items, excess + len(keep))
        for workflow_id in [w for w in oldest if w not in keep][:excess]:
            del self._items[workflow_id]


@dataclass
class _Touched:
    projection: WorkflowProjection
    steps: set[str] = field(default_factory=set)
    replace_steps: bool = False


class BatchFold:
    """Folds one batch of decoded events and collects the rows the batch changes."""

    def __init__(self) -> None:
        self.new: list[tuple[ev.Event, Coordinates, bytes]] = []
        self.anomalies: list[tuple[Any, ...]] = []
        self.touched: dict[str, _Touched] = {}
        self.duplicates = 0

    def add(
        self, projection: WorkflowProjection, event: ev.Event, at: Coordinates, value: bytes
    ) -> None:
        """Fold one event in (a duplicate only counts) and record its rows."""
        if projection.is_duplicate(event):
            self.duplicates += 1
            return
        touched = self.touched.get(event.workflow_id)
        if touched is None:
            touched = self.touched[event.workflow_id] = _Touched(projection)
        steps_before = len(projection.state.steps)
        anomaly = projection.apply(event)
        if len(projection.state.steps) < steps_before:
            # A read-only workflow started over: its earlier steps no longer count.
            touched.replace_steps = True
        if event.step_id is not None:
            touched.steps.add(event.step_id)
        self.new.append((event, at, value))
        if anomaly is not None:
            self.anomalies.append(anomaly_row(anomaly, event, at))

    @property
    def projected(self) -> int:
        """How many new events the batch folded in."""
        return len(self.new)

    def replaced_workflows(self) -> list[str]:
        """Workflows whose stored steps must all be replaced (not just upserted)."""
        return [w for w, t in self.touched.items() if t.replace_steps]

    def tables(self) -> dict[str, Columns]:
        """The rows of every table this batch changes (offsets excluded)."""
        steps: list[tuple[Any, ...]] = []
        workflows: list[tuple[Any, ...]] = []
        escalations: list[tuple[Any, ...]] = []
        for touched in self.touched.values():
            projection = touched.projection
            state = projection.state
            steps.extend(step_row(state, step) for step in _changed_steps(state, touched))
            workflows.append(workflow_row(projection))
            escalations.extend(
                escalation_row(projection, e) for e in projection.escalations.values()
            )
        return {
            "events": _event_columns(self.new),
            "steps": _transpose(STEP_COLUMNS, steps),
            "workflows": _transpose(WORKFLOW_COLUMNS, workflows),
            "escalations": _transpose(ESCALATION_COLUMNS, escalations),
            "anomalies": _transpose(ANOMALY_COLUMNS, self.anomalies),
        }


def _changed_steps(state: WorkflowState, touched: _Touched) -> Iterator[StepState]:
    if touched.replace_steps:
        yield from state.steps.values()
        return
    for step_id in touched.steps:
        step = state.steps.get(step_id)
        if step is not None:
            yield step


EVENT_COLUMNS = (
    "event_id",
    "workflow_id",
    "step_id",
    "fleet_id",
    "producer_id",
    "occurred_at",
    "type",
    "topic",
    "partition",
    "log_offset",
    "value",
)
ANOMALY_COLUMNS = (
    "event_id",
    "workflow_id",
    "step_id",
    "fleet_id",
    "kind",
    "detail",
    "event_type",
    "detected_by",
    "occurred_at",
    "topic",
    "partition",
    "log_offset",
)
STEP_COLUMNS = (
    "workflow_id",
    "step_id",
    "fleet_id",
    "sequence",
    "status",
    "in_doubt",
    "tool",
    "effect",
    "policy",
    "attempt",
    "recovery_attempts",
    "idempotency_key",
    "arguments_digest",
    "arguments_json",
    "deadline",
    "result_json",
    "error",
    "resolved_by",
    "escalation_id",
    "escalation_open",
    "compensation_key",
    "first_at",
    "last_at",
    "intended_at",
    "resolved_at",
    "duration_ms",
)
WORKFLOW_COLUMNS = (
    "workflow_id",
    "fleet_id",
    "name",
    "status",
    "attempt",
    "max_attempts",
    "read_only",
    "escalation_id",
    "started_at",
    "last_at",
    "steps",
    "in_doubt",
    *_STEP_STATUSES,
    "anomalies",
    "events",
)
ESCALATION_COLUMNS = (
    "escalation_id",
    "kind",
    "workflow_id",
    "step_id",
    "fleet_id",
    "reason",
    "status",
    "opened_at",
    "verdict",
    "resolved_by",
    "note",
    "resolved_at",
)


def _transpose(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Columns:
    # zip(*rows) turns rows into columns in C, far cheaper than appending value by value.
    if not rows:
        return {name: [] for name in names}
    return dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))


def _event_columns(new: list[tuple[ev.Event, Coordinates, bytes]]) -> Columns:
    # Column by column: a comprehension per column is several times cheaper than a row loop.
    events = [e for e, _, _ in new]
    return {
        "event_id": [e.event_id for e in events],
        "workflow_id": [e.workflow_id for e in events],
        "step_id": [e.step_id for e in events],
        "fleet_id": [e.fleet_id for e in events],
        "producer_id": [e.producer_id for e in events],
        "occurred_at": [e.occurred_at for e in events],
        "type": [e.body.type for e in events],
        "topic": [at[0] for _, at, _ in new],
        "partition": [at[1] for _, at, _ in new],
        "log_offset": [at[2] for _, at, _ in new],
        "value": [value for _, _, value in new],
    }


def anomaly_row(anomaly: Anomaly, event: ev.Event, at: Coordinates) -> tuple[Any, ...]:
    """The ``anomalies`` row of one anomaly, in ANOMALY_COLUMNS order."""
    body = event.body
    detected_by = body.source.value if isinstance(body, ev.AnomalyObserved) else "projector"
    return (
        anomaly.event_id,
        anomaly.workflow_id,
        anomaly.step_id,
        event.fleet_id,
        anomaly.kind,
        anomaly.detail,
        body.type,
        detected_by,
        event.occurred_at,
        *at,
    )


def _enum_value(value: Any) -> str | None:
    return None if value is None else str(value.value)


def step_row(state: WorkflowState, step: StepState) -> tuple[Any, ...]:
    """The ``steps`` row of one step, in STEP_COLUMNS order."""
    duration = None
    if step.resolved_at is not None and step.intended_at is not None:
        duration = int((step.resolved_at - step.intended_at).total_seconds() * 1000)
    return (
        state.workflow_id,
        step.step_id,
        state.fleet_id,
        step.sequence,
        step.status.value,
        step.in_doubt,
        step.tool,
        _enum_value(step.effect),
        _enum_value(step.policy),
        step.attempt,
        step.recovery_attempts,
        step.idempotency_key,
        step.arguments_digest,
        step.arguments_json,
        step.deadline,
        step.result_json,
        step.error,
        _enum_value(step.resolved_by),
        step.escalation_id,
        step.escalation_open,
        step.compensation_key,
        step.first_at,
        step.last_at,
        step.intended_at,
        step.resolved_at,
        duration,
    )


def workflow_row(projection: WorkflowProjection) -> tuple[Any, ...]:
    """The ``workflows`` row of one workflow, in WORKFLOW_COLUMNS order."""
    state = projection.state
    counts = Counter(step.status.value for step in state.steps.values())
    return (
        state.workflow_id,
        state.fleet_id,
        state.name,
        state.status.value,
        state.attempt,
        state.max_attempts,
        state.read_only,
        state.escalation_id,
        state.started_at,
        state.last_at,
        len(state.steps),
        counts[StepStatus.INTENDED.value],
        *(counts[status] for status in _STEP_STATUSES),
        len(state.anomalies),
        projection.events,
    )


def escalation_row(projection: WorkflowProjection, esc: Escalation) -> tuple[Any, ...]:
    """The ``escalations`` row of one escalation, in ESCALATION_COLUMNS order."""
    state = projection.state
    return (
        esc.escalation_id,
        esc.kind,
        state.workflow_id,
        esc.step_id,
        state.fleet_id,
        esc.reason,
        projection.escalation_status(esc),
        esc.opened_at,
        esc.verdict,
        esc.resolved_by,
        esc.note,
        esc.resolved_at,
    )

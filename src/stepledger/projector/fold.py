"""Batch folding: events into per-workflow fold states, and the rows a batch changes.

Pure: imports only the domain.  Step and workflow status come from
:mod:`stepledger.domain.state` (the one state machine); this module adds only what the
tables need beyond it (escalation records, a bounded cache, change tracking).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.state import Anomaly, RunStatus, StepState, WorkflowState
from stepledger.projector.rows import (
    ANOMALY_COLUMNS,
    ESCALATION_COLUMNS,
    STEP_COLUMNS,
    WORKFLOW_COLUMNS,
    Columns,
    Coordinates,
    anomaly_row,
    escalation_row,
    event_columns,
    out_of_range,
    step_row,
    transpose,
    workflow_row,
)


@dataclass
class EscalationRow:
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
        self.escalations: dict[str, EscalationRow] = {}
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
        if type(body) not in _ESCALATING:
            return
        if isinstance(body, ev.StepAbandoned) and body.escalation_id is not None:
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "step", event.step_id, body.reason, at
            )
        elif isinstance(body, ev.WorkflowDeadLettered):
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "workflow", None, body.reason, at
            )
        elif isinstance(body, ev.WorkflowFinished) and body.escalation_id is not None:
            # compensation_incomplete: effects left standing wait for a human's forward action.
            reason = body.left_standing_json or body.detail or ""
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "left_standing", None, reason, at
            )
        elif isinstance(body, ev.EscalationResolved):
            known = self.escalations.get(body.escalation_id)
            if known is not None:
                known.verdict, known.resolved_by = body.verdict.value, body.by
                known.note, known.resolved_at = body.note, at

    def escalation_status(self, esc: EscalationRow) -> str:
        """``open`` while the fold holds it, ``resolved`` once answered, else ``superseded``."""
        state = self.state
        if esc.kind == "workflow":
            is_open = (
                state.status is RunStatus.DEAD_LETTERED and state.escalation_id == esc.escalation_id
            )
        elif esc.kind == "left_standing":
            is_open = (
                state.status is RunStatus.COMPENSATION_INCOMPLETE
                and state.escalation_id == esc.escalation_id
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


#: The event types that open or answer an escalation (every other one skips the checks).
_ESCALATING = frozenset(
    {ev.StepAbandoned, ev.WorkflowDeadLettered, ev.WorkflowFinished, ev.EscalationResolved}
)


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
        problem = out_of_range(projection.state, event.step_id)
        if problem is not None:
            # Checked per event, not per batch, so where a batch ends cannot change the verdict.
            raise ValueError(problem)
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
            "events": event_columns(self.new),
            "steps": transpose(STEP_COLUMNS, steps),
            "workflows": transpose(WORKFLOW_COLUMNS, workflows),
            "escalations": transpose(ESCALATION_COLUMNS, escalations),
            "anomalies": transpose(ANOMALY_COLUMNS, self.anomalies),
        }


def _changed_steps(state: WorkflowState, touched: _Touched) -> Iterator[StepState]:
    if touched.replace_steps:
        yield from state.steps.values()
        return
    for step_id in touched.steps:
        step = state.steps.get(step_id)
        if step is not None:
            yield step

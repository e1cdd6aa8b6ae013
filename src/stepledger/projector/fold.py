"""Batch folding: events into per-workflow fold states, and the rows a batch changes.

Pure: imports only the domain.  Step and workflow status come from
:mod:`stepledger.domain.state` (the one state machine); this module adds only what the
tables need beyond it (escalation records, a bounded cache, change tracking).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import datetime
from itertools import islice
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.state import StepState, WorkflowState
from stepledger.projector.costs import MODEL_CALL_COLUMNS, model_call
from stepledger.projector.projection import WorkflowProjection
from stepledger.projector.rows import (
    ANOMALY_COLUMNS,
    ESCALATION_COLUMNS,
    EVENT_COLUMNS,
    STEP_COLUMNS,
    WORKFLOW_COLUMNS,
    Columns,
    Coordinates,
    anomaly_row,
    escalation_row,
    event_row,
    out_of_range,
    step_row,
    transpose,
    workflow_row,
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


class _Touched:
    """One workflow a batch folded events of, and the steps they changed."""

    __slots__ = ("projection", "replace_steps", "steps")

    def __init__(self, projection: WorkflowProjection) -> None:
        self.projection = projection
        self.steps: set[str] = set()
        self.replace_steps = False


class BatchFold:
    """Folds one batch of decoded events and collects the rows the batch changes."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        """The ``events`` rows of the new events, built while each event is at hand (one pass
        per column over a batch of events read them back from memory long gone cold)."""
        self.oldest: datetime | None = None
        """The earliest ``occurred_at`` among the events added (duplicates too)."""
        self.anomalies: list[tuple[Any, ...]] = []
        self.touched: dict[str, _Touched] = {}
        self.duplicates = 0
        self.model_calls: list[tuple[Any, ...]] = []
        self.tokens: dict[tuple[str, str, str], int] = {}
        """Tokens of the batch's model turns by (fleet, model, incurred or reused)."""

    def add(
        self, projection: WorkflowProjection, event: ev.Event, at: Coordinates, value: bytes
    ) -> None:
        """Fold one event in (a duplicate only counts) and record its rows."""
        state = projection.state
        oldest = self.oldest
        if oldest is None or event.occurred_at < oldest:
            self.oldest = event.occurred_at
        if event.event_id in state.seen:
            self.duplicates += 1
            return
        workflow_id, step_id = event.workflow_id, event.step_id
        touched = self.touched.get(workflow_id)
        if touched is None:
            touched = self.touched[workflow_id] = _Touched(projection)
        steps_before = len(state.steps)
        anomaly = projection.apply(event)
        problem = out_of_range(state, step_id)
        if problem is not None:
            # Checked per event, not per batch, so where a batch ends cannot change the verdict.
            raise ValueError(problem)
        if len(state.steps) < steps_before:
            # A read-only workflow started over: its earlier steps no longer count.
            touched.replace_steps = True
        if step_id is not None:
            touched.steps.add(step_id)
        self.events.append(event_row(event, at, value))
        if anomaly is not None:
            self.anomalies.append(anomaly_row(anomaly, event, at))
        elif step_id is not None:
            self._count_model_call(state, event, at)

    def _count_model_call(self, state: WorkflowState, event: ev.Event, at: Coordinates) -> None:
        found = model_call(state, event, at)
        if found is None:
            return
        kind, usage, row = found
        self.model_calls.append(row)
        key = (event.fleet_id, usage.model or "", kind)
        self.tokens[key] = self.tokens.get(key, 0) + usage.tokens

    @property
    def projected(self) -> int:
        """How many new events the batch folded in."""
        return len(self.events)

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
            "events": transpose(EVENT_COLUMNS, self.events),
            "steps": transpose(STEP_COLUMNS, steps),
            "workflows": transpose(WORKFLOW_COLUMNS, workflows),
            "escalations": transpose(ESCALATION_COLUMNS, escalations),
            "anomalies": transpose(ANOMALY_COLUMNS, self.anomalies),
            "model_calls": transpose(MODEL_CALL_COLUMNS, self.model_calls),
        }


def _changed_steps(state: WorkflowState, touched: _Touched) -> Iterator[StepState]:
    if touched.replace_steps:
        yield from state.steps.values()
        return
    for step_id in touched.steps:
        step = state.steps.get(step_id)
        if step is not None:
            yield step

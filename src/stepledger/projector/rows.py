"""Rows of the projected tables: one tuple per row, in the tables' column order.

Pure, like :mod:`stepledger.projector.fold`: states in, plain Python values out (the store
turns them into Arrow).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from stepledger.domain import events as ev
from stepledger.domain.state import Anomaly, StepState, StepStatus, WorkflowState

if TYPE_CHECKING:
    from stepledger.projector.projection import EscalationRow, WorkflowProjection

Columns = dict[str, list[Any]]
Coordinates = tuple[str, int, int]
"""Where a record was read: (topic, partition, offset)."""

_STEP_STATUSES = tuple(s.value for s in StepStatus)

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
    "app_version",
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
    "app_version",
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


#: The state attributes that land in 32-bit columns (a test checks them against the schema):
#: a fold can compute one past the range (a sum of attempts), and Arrow would refuse it.
STEP_INT32 = ("sequence", "attempt", "recovery_attempts")
WORKFLOW_INT32 = ("attempt", "max_attempts")


_NO_VERSION: tuple[None, None] = (None, None)
_workflow_ints = attrgetter(*WORKFLOW_INT32)
_step_ints = attrgetter(*STEP_INT32)


def out_of_range(state: WorkflowState, step_id: str | None) -> str | None:
    """The first 32-bit column value of this workflow (and step) its column cannot hold."""
    step = state.steps.get(step_id) if step_id is not None else None
    values = _workflow_ints(state) + (_step_ints(step) if step is not None else ())
    if min(values) >= ev.INT32_MIN and max(values) <= ev.INT32_MAX:
        return None  # the common case, checked in C; the loop below names the culprit
    checks: list[tuple[object, tuple[str, ...], str]] = [(state, WORKFLOW_INT32, "workflow")]
    if step is not None:
        checks.append((step, STEP_INT32, "step"))
    for obj, names, what in checks:
        for name in names:
            value = getattr(obj, name)
            if not ev.INT32_MIN <= value <= ev.INT32_MAX:
                return f"{what} {name} {value} does not fit a 32-bit column"
    return None


def transpose(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Columns:
    # zip(*rows) turns rows into columns in C, far cheaper than appending value by value.
    if not rows:
        return {name: [] for name in names}
    return dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))


def event_row(event: ev.Event, at: Coordinates, value: bytes) -> tuple[Any, ...]:
    """The ``events`` row of one event, in EVENT_COLUMNS order."""
    return (
        event.event_id,
        event.workflow_id,
        event.step_id,
        event.fleet_id,
        event.producer_id,
        event.occurred_at,
        event.body.type,
        *at,
        value,
    )


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


def step_row(state: WorkflowState, step: StepState) -> tuple[Any, ...]:
    """The ``steps`` row of one step, in STEP_COLUMNS order."""
    duration = None
    if step.resolved_at is not None and step.intended_at is not None:
        duration = int((step.resolved_at - step.intended_at).total_seconds() * 1000)
    # Enum values by ``_value_`` (the member's plain attribute; ``.value`` is a property),
    # inline: a helper call per value cost more than the row's other columns.
    effect, policy, resolved_by = step.effect, step.policy, step.resolved_by
    return (
        state.workflow_id,
        step.step_id,
        state.fleet_id,
        step.sequence,
        step.status._value_,
        step.status is StepStatus.INTENDED,
        step.tool,
        None if effect is None else effect._value_,
        None if policy is None else policy._value_,
        step.attempt,
        step.recovery_attempts,
        step.idempotency_key,
        step.arguments_digest,
        step.arguments_json,
        step.deadline,
        step.result_json,
        step.error,
        None if resolved_by is None else resolved_by._value_,
        step.escalation_id,
        step.escalation_open,
        step.compensation_key,
        step.first_at,
        step.last_at,
        step.intended_at,
        step.resolved_at,
        duration,
        state.versions.get(step.epoch, _NO_VERSION)[0],  # the app whose claim wrote the intent
    )


def workflow_row(projection: WorkflowProjection) -> tuple[Any, ...]:
    """The ``workflows`` row of one workflow, in WORKFLOW_COLUMNS order."""
    state = projection.state
    counts = dict.fromkeys(_STEP_STATUSES, 0)  # cheaper than a Counter for a few steps
    for step in state.steps.values():
        counts[step.status._value_] += 1
    return (
        state.workflow_id,
        state.fleet_id,
        state.name,
        state.shown_status._value_,  # paused (or cancelling) while an operator holds it
        state.attempt,
        state.max_attempts,
        state.read_only,
        state.escalation_id,
        state.started_at,
        state.last_at,
        len(state.steps),
        counts[StepStatus.INTENDED.value],
        *counts.values(),
        len(state.anomalies),
        projection.events,
        state.versions.get(state.attempt, _NO_VERSION)[0],  # the latest claim's app
    )


def escalation_row(projection: WorkflowProjection, esc: EscalationRow) -> tuple[Any, ...]:
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

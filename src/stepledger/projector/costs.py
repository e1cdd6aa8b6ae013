"""The token ledger's rows: one ``model_calls`` row per model turn incurred or reused.

Pure, like :mod:`stepledger.projector.rows`.  A turn is *incurred* by the outcome that
recorded it (the model was asked; its usage rides on the step's result) and *reused* by
each ``model_turn_reused`` event (a run replayed it; nothing was spent).  Both rows carry
the recorded turn's usage, so the sums of either kind are the tokens spent and the tokens
a crash did not spend again.
"""

from __future__ import annotations

from typing import Any, Literal

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.state import WorkflowState
from stepledger.domain.usage import TurnUsage, usage_of
from stepledger.projector.rows import Coordinates
from stepledger.wire import MODEL_STEP_TOOL

Kind = Literal["incurred", "reused"]

MODEL_CALL_COLUMNS = (
    "event_id",
    "workflow_id",
    "step_id",
    "fleet_id",
    "kind",
    "attempt",
    "model",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost",
    "occurred_at",
    "topic",
    "partition",
    "log_offset",
)

MODEL_CALL_VIEWS = {
    "model_costs_by_workflow": """
        SELECT workflow_id, fleet_id,
               count(*) FILTER (kind = 'incurred') AS turns_incurred,
               count(*) FILTER (kind = 'reused') AS turns_reused,
               coalesce(sum(input_tokens + output_tokens) FILTER (kind = 'incurred'), 0)
                 AS tokens_incurred,
               coalesce(sum(input_tokens + output_tokens) FILTER (kind = 'reused'), 0)
                 AS tokens_reused,
               sum(cost) FILTER (kind = 'incurred') AS cost_incurred,
               sum(cost) FILTER (kind = 'reused') AS cost_reused
        FROM model_calls GROUP BY workflow_id, fleet_id""",
    "model_costs_by_fleet_day": """
        SELECT fleet_id, CAST(occurred_at AT TIME ZONE 'UTC' AS DATE) AS day, model,
               count(*) FILTER (kind = 'incurred') AS turns_incurred,
               count(*) FILTER (kind = 'reused') AS turns_reused,
               coalesce(sum(input_tokens + output_tokens) FILTER (kind = 'incurred'), 0)
                 AS tokens_incurred,
               coalesce(sum(input_tokens + output_tokens) FILTER (kind = 'reused'), 0)
                 AS tokens_reused,
               sum(cost) FILTER (kind = 'incurred') AS cost_incurred,
               sum(cost) FILTER (kind = 'reused') AS cost_reused
        FROM model_calls GROUP BY fleet_id, day, model""",
}
"""Incurred against reused tokens and cost, per workflow and per fleet, day and model."""


def model_call(
    state: WorkflowState, event: ev.Event, at: Coordinates
) -> tuple[Kind, TurnUsage, tuple[Any, ...]] | None:
    """The ``model_calls`` row an event adds (folded already), with its kind and usage."""
    body, step_id = event.body, event.step_id
    if step_id is None:
        return None
    kind: Kind
    if isinstance(body, ev.StepOutcome) and body.status is OutcomeStatus.SUCCEEDED:
        kind, attempt = "incurred", state.attempt
    elif isinstance(body, ev.ModelTurnReused):
        kind, attempt = "reused", body.attempt
    else:
        return None
    step = state.steps.get(step_id)
    if step is None or step.tool != MODEL_STEP_TOOL:
        return None
    usage = usage_of(step.result_json)
    if usage is None:
        return None
    row = (
        event.event_id,
        event.workflow_id,
        step_id,
        event.fleet_id,
        kind,
        attempt,
        usage.model or "",
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_tokens,
        usage.reasoning_tokens,
        usage.cost,
        event.occurred_at,
        *at,
    )
    return kind, usage, row

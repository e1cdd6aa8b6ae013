"""Compensating a workflow: undo its completed compensatable steps, newest first.

Each compensation is its own durable intent/outcome pair (``compensation_intended`` before
the hook is called, ``compensation_outcome`` after), so a crash in the middle leaves a
compensation the resume (or the recovery daemon) carries through.  Nothing is undone
while an effectful step's outcome is unknown: whether to undo around it depends on it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain import resolution as rs
from stepledger.domain.enums import CompensationStatus, Source
from stepledger.domain.saga import compensation_plan
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import NotFound, Tool
from stepledger.errors import StepInDoubtError, ToolCallError
from stepledger.recovery.hooks import intent_arguments, known_result

if TYPE_CHECKING:
    from stepledger.producer.workflow import Workflow


def compensate(workflow: Workflow, reason: str) -> list[str]:
    """Compensate every completed compensatable step in reverse order; return their ids."""
    undo, blockers = compensation_plan(workflow.state)
    if blockers:
        names = ", ".join(f"{s.step_id} ({s.status.value})" for s in blockers)
        raise StepInDoubtError(
            f"cannot compensate around steps whose outcome is unknown: {names}; resolve them first",
            workflow_id=workflow.workflow_id,
            step_id=blockers[0].step_id,
        )
    done = []
    for step in undo:
        _compensate_one(workflow, step, workflow.tool(step.tool), reason)
        done.append(step.step_id)
    return done


def _compensate_one(workflow: Workflow, step: StepState, tool: Tool, reason: str) -> None:
    events = workflow.ledger.events
    wf = workflow.workflow_id
    if step.status is StepStatus.SUCCEEDED:
        intended = ev.CompensationIntended(
            idempotency_key=ids.compensation_key(step.idempotency_key),
            reason=reason,
            source=Source.AGENT,
            deadline=events.clock() + timedelta(seconds=tool.timeout_s),
        )
        workflow.record(events.envelope(wf, step.step_id, intended, step.attempt, "agent"))
    assert tool.compensate is not None  # a compensatable tool always has the hook
    try:
        # The hook gets the step's own key: it names the effect to undo.
        answer = tool.compensate(intent_arguments(step), step.idempotency_key, known_result(step))
    except Exception as exc:
        failed = ev.CompensationOutcome(
            status=CompensationStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            source=Source.AGENT,
        )
        workflow.record(events.envelope(wf, step.step_id, failed, step.attempt, "agent"))
        raise ToolCallError(
            f"compensation of {step.step_id!r} failed: {exc}",
            workflow_id=wf,
            step_id=step.step_id,
            tool=tool.name,
        ) from exc
    workflow.record(events.envelope(wf, step.step_id, _outcome(answer), step.attempt, "agent"))


def _outcome(answer: Any) -> ev.CompensationOutcome:
    result = None if isinstance(answer, NotFound) else answer
    return ev.CompensationOutcome(
        status=rs.compensation_status(answer),
        result_json=None if result is None else ids.canonical_json(result),
        source=Source.AGENT,
    )

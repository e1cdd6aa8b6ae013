"""Compensating a workflow: undo every effect that happened and can be undone, newest first.

Each compensation is its own durable intent/outcome pair (``compensation_intended`` before
the hook is called, ``compensation_outcome`` after), so a crash in the middle leaves a
compensation the resume (or the recovery daemon) carries through.  Nothing is undone
while an effectful step's outcome is unknown: whether to undo around it depends on it.

A workflow ends ``compensated`` only when nothing that happened is left standing.  An
effect that cannot be undone (the pivot, an unkeyed email) or whose undo failed ends it
``compensation_incomplete``, with an escalation that lists each effect left standing and
the forward action a human might take (the tool's ``correction``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain import resolution as rs
from stepledger.domain.enums import CompensationStatus, Source, WorkflowStatus
from stepledger.domain.saga import compensation_plan, left_standing
from stepledger.domain.state import RunStatus, StepState, StepStatus, WorkflowState
from stepledger.domain.tools import NotFound, Tool
from stepledger.errors import StepInDoubtError
from stepledger.producer import fence
from stepledger.resolution.hooks import intent_arguments, known_result

if TYPE_CHECKING:
    from stepledger.producer.session import WorkflowHandle

logger = logging.getLogger(__name__)


def compensate(
    workflow: WorkflowHandle, reason: str, only: Collection[str] | None = None
) -> list[str]:
    """Undo every undoable effect that happened, newest first; return the undone step ids.

    A failed undo is recorded (``compensation_outcome`` failed) and the others still run:
    the effect it leaves standing is reported by :func:`finish`.  ``only``: undo just these
    steps (a restart from a step undoes what follows it).
    """
    undo, blockers = compensation_plan(workflow.state)
    if only is not None:
        undo = [s for s in undo if s.step_id in only]
    if blockers:
        names = ", ".join(f"{s.step_id} ({s.status.value})" for s in blockers)
        raise StepInDoubtError(
            f"cannot compensate around steps whose outcome is unknown: {names}; resolve them first",
            workflow_id=workflow.workflow_id,
            step_id=blockers[0].step_id,
        )
    done = []
    for step in undo:
        if _compensate_one(workflow, step, workflow.tool(step.tool), reason):
            done.append(step.step_id)
    return done


def standing(state: WorkflowState) -> list[StepState]:
    """Effects that happened and were not undone (see :func:`saga.left_standing`)."""
    return left_standing(state)


def finish(
    workflow: WorkflowHandle, reason: str, *, ended: WorkflowStatus = WorkflowStatus.COMPENSATED
) -> None:
    """End the workflow ``ended`` (compensated; an operator's cancel: cancelled) when
    nothing that happened is left standing, else compensation_incomplete with an escalation."""
    if workflow.state.status is not RunStatus.RUNNING:
        return
    left = standing(workflow.state)
    if not left:
        workflow.finish(ended, reason)
        return
    wf = workflow.workflow_id
    escalation = ids.escalation_id(wf, None, "left_standing", workflow.attempt)
    entries = [_standing_entry(workflow, s) for s in left]
    names = ", ".join(f"{e['step_id']} ({e['tool']})" for e in entries)
    body = ev.WorkflowFinished(
        status=WorkflowStatus.COMPENSATION_INCOMPLETE,
        detail=f"{reason}; left standing: {names}",
        escalation_id=escalation,
        left_standing_json=ids.canonical_json(entries),
        runner=workflow.runner,
    )
    workflow.record(workflow.ledger.events.envelope(wf, None, body))


def _standing_entry(workflow: WorkflowHandle, step: StepState) -> dict[str, Any]:
    tool = workflow.known_tool(step.tool)
    if step.status is StepStatus.COMPENSATION_FAILED:
        why = f"its compensation failed: {step.error}"
    else:
        why = "it cannot be undone" if not step.undoable else "it was not undone"
    action = tool.correction if tool is not None and tool.correction else ""
    return {
        "step_id": step.step_id,
        "tool": step.tool,
        "idempotency_key": step.idempotency_key,
        "why": why,
        "forward_action": action or f"undo the effect of {step.tool} by hand (no correction known)",
    }


def _compensate_one(workflow: WorkflowHandle, step: StepState, tool: Tool, reason: str) -> bool:
    events = workflow.ledger.events
    wf = workflow.workflow_id
    if step.status is StepStatus.SUCCEEDED:
        intended = ev.CompensationIntended(
            idempotency_key=ids.compensation_key(step.idempotency_key),
            reason=reason,
            source=Source.AGENT,
            deadline=events.clock() + timedelta(seconds=tool.timeout_s),
            attempt=step.attempt,
            epoch=workflow.epoch,
            runner=workflow.runner,
        )
        # Named by its runner: a zombie's claim is never a duplicate of the owner's.
        qualifiers = (step.attempt, "agent", workflow.runner)
        claim = events.envelope(wf, step.step_id, intended, *qualifiers)
        # Only the workflow's owner undoes: the claim is read back before the hook runs.
        fence.ensure_owner(workflow.read_claim, claim, workflow.epoch, workflow.record(claim))
    # A compensation already under way (its claim stood) is carried through under the
    # step's key, as the owner and the recovery daemon would carry it through.
    assert tool.compensate is not None  # an undoable tool always has the hook
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
        logger.warning(
            "compensation failed; the effect is left standing",
            extra={"workflow_id": wf, "step_id": step.step_id, "error": failed.error},
        )
        return False
    workflow.record(events.envelope(wf, step.step_id, _outcome(answer), step.attempt, "agent"))
    return True


def _outcome(answer: Any) -> ev.CompensationOutcome:
    result = None if isinstance(answer, NotFound) else answer
    return ev.CompensationOutcome(
        status=rs.compensation_status(answer),
        result_json=None if result is None else ids.canonical_json(result),
        source=Source.AGENT,
    )

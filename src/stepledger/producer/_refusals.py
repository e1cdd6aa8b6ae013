"""The errors a step call or a finish raises when the log stands in the way."""

from __future__ import annotations

from stepledger.domain.replay import Move, MoveKind
from stepledger.domain.state import StepState, StepStatus, WorkflowState
from stepledger.errors import (
    ApprovalDeniedError,
    LedgerStateError,
    StepCompensatedError,
    StepInDoubtError,
    ToolCallError,
)
from stepledger.terminal import shell_arg


def refusal(workflow_id: str, move: Move, step_id: str) -> LedgerStateError | ToolCallError:
    """The error for a step call the log refuses (failed before, denied, escalated, undone)."""
    step = move.step
    assert step is not None
    tool = step.tool
    if move.kind is MoveKind.RAISE_FAILED:
        return ToolCallError(
            f"step {step_id!r} failed before: {step.error}",
            workflow_id=workflow_id,
            step_id=step_id,
            tool=tool,
        )
    if move.kind is MoveKind.DENIED:
        return ApprovalDeniedError(
            f"step {step_id!r} was denied approval",
            workflow_id=workflow_id,
            step_id=step_id,
            tool=tool,
        )
    if move.kind is MoveKind.ESCALATED:
        esc = step.escalation_id
        return StepInDoubtError(
            f"step {step_id!r} waits for a human: escalation {esc} "
            f"(`stepledger escalations resolve {shell_arg(esc or '')} --happened|--not-happened "
            "--by NAME`)",
            escalation_id=esc,
            workflow_id=workflow_id,
            step_id=step_id,
            tool=tool,
        )
    by = step.resolved_by.value if step.resolved_by is not None else None
    return StepCompensatedError(
        f"step {step_id!r} is {step.status.value} (decided by {by or 'unknown'}): its effect "
        "was undone, so it does not run again; compensate the workflow",
        decision=step.status.value,
        decided_by=by,
        workflow_id=workflow_id,
        step_id=step_id,
        tool=tool,
    )


def open_effects(state: WorkflowState) -> list[StepState]:
    """Effectful steps whose outcome is not settled (in doubt, compensating, escalated)."""
    return [
        s
        for s in state.ordered_steps()
        if s.effectful
        and (s.status in (StepStatus.INTENDED, StepStatus.COMPENSATING) or s.escalation_open)
    ]


def ensure_nothing_open(state: WorkflowState) -> None:
    """Raise StepInDoubtError when a workflow would complete with unsettled effects."""
    steps = open_effects(state)
    if steps:
        names = ", ".join(s.step_id for s in steps)
        raise StepInDoubtError(
            f"workflow {state.workflow_id!r} cannot complete: {names} unresolved",
            workflow_id=state.workflow_id,
            step_id=steps[0].step_id,
        )

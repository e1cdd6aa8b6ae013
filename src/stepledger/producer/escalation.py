"""What a runner hands to a person: a saga refusal at run time, a failure after the pivot.

Two cases, each recorded in the log before the agent is told, so the workflow is never
left running with nobody to decide it:

- **a step the saga rules refuse at run time** (an undoable step once a pivot may have
  happened, an effect in a read-only workflow) when no plan declared it (a declared plan
  is refused by ``check_plan`` before anything is recorded).  The workflow cannot go on as
  written: it is dead-lettered with an escalation (``workflow_dead_lettered``, reason
  ``saga_violation``; a dead letter as for a resume loop), and the one-line
  :class:`~stepledger.errors.SagaViolationError` names the fix and the escalation.  Once
  the code is fixed a person clears it (``stepledger workflows clear``) and the next run
  goes on.  A pivot that only waits for undoable steps to be decided is not escalated:
  those steps are recovery's or a person's already, and the pivot runs once they are;
- **a definite failure after the pivot of a step that cannot be repeated safely** (an
  unkeyed receipt email after an irreversible charge): the saga cannot go back and the
  step may not run again on its own, so its failure is escalated (``step_abandoned`` by
  the agent, on the failed step) and a person answers with the verdicts that exist:
  ``--not-happened`` runs it again, ``--happened`` takes it as done.
"""

from __future__ import annotations

from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain.enums import Source
from stepledger.domain.replay import stranded
from stepledger.domain.saga import Violation, raise_violations, step_violations, waits_only
from stepledger.domain.state import StepState
from stepledger.domain.tools import Tool
from stepledger.errors import SagaViolationError
from stepledger.producer import fence
from stepledger.producer.session import WorkflowHandle
from stepledger.terminal import shell_arg

SAGA_VIOLATION = "saga_violation"
FAILED_AFTER_PIVOT = "failed_after_pivot"
_ERROR_KEPT = 500


def refuse(workflow: WorkflowHandle, step_id: str, tool: Tool, found: list[Violation]) -> None:
    """Refuse a step the saga rules forbid now; record an escalation unless it only waits.

    The log is read back first: only the workflow's owner decides (a runner that lost its
    claim raises WorkflowTakenOverError), and a refusal the log no longer supports (a step
    in doubt was decided meanwhile) lets the step run.
    """
    if waits_only(found):
        raise_violations(found, workflow_id=workflow.workflow_id)
    workflow.reload()
    state = workflow.state
    fence.ensure_claimed(state, workflow.runner, workflow.epoch)
    found = step_violations(state, step_id, tool)
    if not found:
        return
    if waits_only(found):
        raise_violations(found, workflow_id=workflow.workflow_id)
    wf = workflow.workflow_id
    escalation = ids.escalation_id(wf, step_id, SAGA_VIOLATION, state.attempt)
    problems = "; ".join(str(v) for v in found)
    reason = f"{SAGA_VIOLATION}: step {step_id!r} ({tool.name}) refused: {problems}"
    body = ev.WorkflowDeadLettered(attempt=state.attempt, reason=reason, escalation_id=escalation)
    event = workflow.ledger.events.envelope(wf, None, body, SAGA_VIOLATION, step_id, state.attempt)
    # The dead letter first, as for a resume loop: a crash between the two does both again.
    workflow.ledger.dead_letters.publish(event, reason=reason)
    workflow.record(event)
    outstanding = tuple(dict.fromkeys(o for v in found for o in (v.outstanding or (v.step_id,))))
    raise SagaViolationError(
        f"step {step_id!r} refused: {problems}; the workflow waits for a person (escalation "
        f"{escalation}): once fixed, `stepledger workflows clear {shell_arg(wf)} --by NAME`",
        outstanding=outstanding,
        escalation_id=escalation,
        workflow_id=wf,
        step_id=step_id,
        tool=tool.name,
    )


def failure_escalation(workflow: WorkflowHandle, step: StepState) -> ev.Event:
    """The escalation of a definite failure after the pivot (the caller records it)."""
    wf = workflow.workflow_id
    escalation = ids.escalation_id(wf, step.step_id, FAILED_AFTER_PIVOT, step.attempt)
    error = (step.error or "")[:_ERROR_KEPT]
    reason = (
        f"{FAILED_AFTER_PIVOT}: step {step.step_id!r} ({step.tool}) failed after the pivot "
        f"and cannot be repeated safely: {error}; --not-happened runs it again, --happened "
        "takes it as done"
    )
    body = ev.StepAbandoned(
        reason=reason,
        escalation_id=escalation,
        evidence_json=ids.canonical_json({"error": error, "attempt": step.attempt}),
        source=Source.AGENT,
    )
    return workflow.ledger.events.envelope(wf, step.step_id, body, escalation)


def stranded_failure(workflow: WorkflowHandle, step_id: str) -> ev.Event | None:
    """The escalation to record after a step's failed outcome, if a person must decide it."""
    with workflow.lock:
        step = workflow.state.steps.get(step_id)
    return failure_escalation(workflow, step) if step is not None and stranded(step) else None


def note(workflow: WorkflowHandle, step_id: str, exc: BaseException) -> None:
    """Tell the agent, on the tool's own error, which escalation now holds the step."""
    with workflow.lock:
        step = workflow.state.steps[step_id]
    esc = step.escalation_id or "?"
    exc.add_note(
        f"step {step_id!r} failed after the pivot and cannot be repeated safely: escalation "
        f"{esc} waits for a person (`stepledger escalations resolve {shell_arg(esc)} "
        f"--not-happened|--happened --by NAME`); workflow {workflow.workflow_id!r} goes on "
        "after it"
    )

"""A runner under an operator's hold: a paused (or cancelling) workflow starts no new step.

An operator's pause is an event in the workflow's log (``workflow_paused``), so the runner
learns of it the way it learns of a newer claim: from the log's order.  Two checks, one
rule (:func:`holds`):

- before a step's intent, on the state the handle holds (no I/O): a pause it already
  knows stops the step before anything is recorded;
- between the intent and the call, on the fold through the intent that the ownership
  fence (:mod:`stepledger.producer.fence`) reads anyway for every effectful call: a pause
  that lies before the intent in the log stops the call.  The intent then gets a
  ``not_happened`` outcome (nothing was called), so the step runs again under its key
  once unpaused.  An effectful step therefore costs no read more than it did; a
  read-only step makes no effect and is held by the pause the handle knows.

A pause that lands after the intent lets the step in flight finish and record its
outcome.  Then the runner waits for the unpause or raises ``WorkflowPausedError``
(``ResumeOptions.on_pause``); a request to cancel always raises ``WorkflowCancelledError``
(``stepledger workflows cancel`` carries it through).  A runner started again on a paused
workflow reads the pause with the rest of the log: it stays paused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.errors import WorkflowCancelledError, WorkflowPausedError
from stepledger.terminal import shell_arg

if TYPE_CHECKING:
    from stepledger.producer.session import WorkflowHandle
    from stepledger.producer.stepcall import PendingCall

logger = logging.getLogger(__name__)

#: A wait for the unpause follows the log in slices this long (then reads the state again).
FOLLOW_SLICE_S = 5.0
_LIFTS = (ev.WorkflowUnpaused, ev.WorkflowCancelRequested, ev.WorkflowFinished)


def holds(state: WorkflowState, step_id: str) -> bool:
    """True when the hold stops this step call: a step that succeeded still replays."""
    if not state.halted:
        return False
    step = state.steps.get(step_id)
    return step is None or step.status is not StepStatus.SUCCEEDED


def halted_error(state: WorkflowState, step_id: str | None) -> WorkflowPausedError:
    """The one-line error of a step call the hold stopped (nothing was called)."""
    wf = state.workflow_id
    at = f" before step {step_id!r}" if step_id else ""
    if state.cancel_requested_by is not None:
        return WorkflowCancelledError(
            f"workflow {wf!r}: {state.cancel_requested_by} asked to cancel it "
            f"({state.cancel_reason or 'no reason given'}); this runner stopped{at}, nothing "
            f"was called; `stepledger workflows cancel {shell_arg(wf)}` carries it through",
            by=state.cancel_requested_by,
            workflow_id=wf,
            step_id=step_id,
        )
    return WorkflowPausedError(
        f"workflow {wf!r} is paused by {state.paused_by} "
        f"({state.pause_reason or 'no reason given'}); stopped{at}, nothing was called; "
        f"`stepledger workflows unpause {shell_arg(wf)}` lets it go on",
        by=state.paused_by,
        workflow_id=wf,
        step_id=step_id,
    )


def hold(workflow: WorkflowHandle, step_id: str) -> None:
    """Return once the step may start; raise WorkflowPausedError while the hold stands.

    With ``ResumeOptions(on_pause="wait")`` a pause is waited out (the log followed for
    the unpause, up to ``pause_wait_s``); a request to cancel is never waited out.
    """
    if not holds(workflow.state, step_id):
        return
    options = workflow.ledger.options
    timer = workflow.ledger.timer
    if options.on_pause == "wait" and workflow.state.cancel_requested_by is None:
        ends = timer.monotonic() + options.pause_wait_s
        logger.info("workflow %s is paused: step %s waits", workflow.workflow_id, step_id)
        while holds(workflow.state, step_id) and workflow.state.cancel_requested_by is None:
            left = ends - timer.monotonic()
            if left <= 0 or workflow.position is None:
                break
            workflow.ledger.history.follow(
                workflow.workflow_id,
                workflow.position,
                lambda e: isinstance(e.body, _LIFTS),
                min(left, FOLLOW_SLICE_S),
            )
            workflow.reload()
    if holds(workflow.state, step_id):
        raise halted_error(workflow.state, step_id)


def not_called(workflow: WorkflowHandle, call: PendingCall) -> ev.Event:
    """The outcome of an intent whose call the hold stopped: it did not happen."""
    return workflow.ledger.events.outcome(
        workflow.workflow_id,
        call.step_id,
        attempt=call.attempt,
        status=OutcomeStatus.NOT_HAPPENED,
        error="the workflow was paused before the call; nothing was called",
        scrub=call.scrub,
        runner=workflow.runner,
    )

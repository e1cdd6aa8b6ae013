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
from stepledger.producer.stepcall import Blocking, PendingCall, Sleep, StepProtocol
from stepledger.terminal import shell_arg

if TYPE_CHECKING:
    from stepledger.producer.session import WorkflowHandle

logger = logging.getLogger(__name__)

#: How often a runner waiting for the unpause reads its workflow again (the unpause's latency).
PAUSE_POLL_S = 0.5


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


def hold(workflow: WorkflowHandle, step_id: str) -> StepProtocol:
    """Return once the step may start; raise WorkflowPausedError while the hold stands.

    With ``ResumeOptions(on_pause="wait")`` a pause is waited out: the workflow is read
    again every ``PAUSE_POLL_S`` (a catch-up of its partition's index), up to
    ``pause_wait_s``, holding no thread while it sleeps (a fleet on one event loop waits
    with every workflow paused); a request to cancel is never waited out.
    """
    options, timer = workflow.ledger.options, workflow.ledger.timer
    if options.on_pause == "wait" and holds(workflow.state, step_id):
        ends = timer.monotonic() + options.pause_wait_s
        logger.info("workflow %s is paused: step %s waits", workflow.workflow_id, step_id)
        while _waits(workflow.state, step_id) and timer.monotonic() < ends:
            yield Sleep(PAUSE_POLL_S)
            yield Blocking(workflow.reload, ())
    if holds(workflow.state, step_id):
        raise halted_error(workflow.state, step_id)


def _waits(state: WorkflowState, step_id: str) -> bool:
    return holds(state, step_id) and state.cancel_requested_by is None


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

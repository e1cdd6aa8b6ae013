"""What an operator's command appends to a workflow's log, decided from its fold (pure).

Pause, unpause and cancel are events of the workflow (``workflow_paused``,
``workflow_unpaused``, ``workflow_cancel_requested``) naming who asked and why, so every
reader (the runner before a step, the recovery daemon, the projection, the inbox) agrees
on them by folding the same log.  Each decision here says what to append, or why nothing
is appended (already so, or the workflow ended), in one line an operator reads per
workflow of a selection.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepledger.domain import events as ev
from stepledger.domain.state import ENDED, WorkflowState

OperatorBody = ev.WorkflowPaused | ev.WorkflowUnpaused | ev.WorkflowCancelRequested


@dataclass(frozen=True)
class Steer:
    """One workflow's answer to an operator's command: the event to append, or why none."""

    workflow_id: str
    body: OperatorBody | None
    note: str
    """What was done or why nothing was (one line)."""


def pause(
    state: WorkflowState, by: str, reason: str, auth: str | None, *, hold_recovery: bool = False
) -> Steer:
    """Pause a running workflow: its next step does not start until it is unpaused.

    ``hold_recovery``: recovery settles none of its in-doubt steps either until then; asked
    of a workflow a plain pause holds, it is a new pause (the unpause then names it).
    """
    wf = state.workflow_id
    if state.status in ENDED:
        return Steer(wf, None, f"{wf}: not paused, it ended {state.status.value}")
    if state.paused and (state.recovery_held_by is not None or not hold_recovery):
        held = " (recovery held)" if state.recovery_held_by is not None else ""
        return Steer(wf, None, f"{wf}: already paused by {state.paused_by}{held}")
    body = ev.WorkflowPaused(
        by=by, reason=reason, auth=auth, pause=state.pause + 1, hold_recovery=hold_recovery
    )
    held = ", recovery held" if hold_recovery else ""
    return Steer(wf, body, f"{wf}: paused (pause {body.pause}{held})")


def unpause(state: WorkflowState, by: str, reason: str, auth: str | None) -> Steer:
    """Lift the pause that holds a workflow: its next step may start."""
    wf = state.workflow_id
    if not state.paused:
        return Steer(wf, None, f"{wf}: not paused ({state.shown_status.value})")
    body = ev.WorkflowUnpaused(by=by, reason=reason, auth=auth, pause=state.pause)
    return Steer(wf, body, f"{wf}: unpaused (pause {state.pause} by {state.paused_by})")


def request_cancel(state: WorkflowState, by: str, reason: str, auth: str | None) -> Steer:
    """Ask to cancel a workflow: no new step starts; its cancel is then carried through."""
    wf = state.workflow_id
    if state.status in ENDED:
        return Steer(wf, None, f"{wf}: not cancelled, it ended {state.status.value}")
    if state.cancel_requested_by is not None:
        return Steer(wf, None, f"{wf}: cancel already asked by {state.cancel_requested_by}")
    body = ev.WorkflowCancelRequested(by=by, reason=reason, auth=auth)
    return Steer(wf, body, f"{wf}: cancel asked")

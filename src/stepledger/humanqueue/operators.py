"""An operator's commands on workflows: pause, unpause, cancel (the CLI's and the inbox's).

Each command is an event of the workflow's log (:mod:`stepledger.domain.operators` decides
it from the workflow's fold), appended; the log's fold decides what it does (the first of
two pauses holds, an unpause of an older pause lifts nothing), for every reader alike.  A
cancel is then carried through by the one compensation path a runner uses
(:mod:`stepledger.producer.compensation`): this
process opens the workflow as a runner (a claim, which fences off the runner that held
it: that one calls nothing more), its in-doubt steps are settled by their policies at the
open, its undoable effects are compensated newest first, and it ends ``cancelled``, or
``compensation_incomplete`` with an escalation naming what a person must correct.  A step
that waits for a person (an escalated one) stops the cancel, which says so; the command
carries it through when run again once that person answered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stepledger.domain import events as ev
from stepledger.domain import operators
from stepledger.domain import restart as restarting
from stepledger.domain.enums import WorkflowStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.operators import Steer
from stepledger.domain.restart import RestartPlan
from stepledger.domain.state import ENDED, WorkflowState, replay
from stepledger.errors import LedgerStateError, StepLedgerError
from stepledger.history.protocol import WorkflowHistory
from stepledger.log import EventLog
from stepledger.producer import Ledger, compensation, opening
from stepledger.producer.opening import WorkflowSpec
from stepledger.producer.workflow import Workflow

Decide = Callable[[WorkflowState, str, str, str | None], Steer]

#: The operators' commands by name (the CLI's and the inbox's words).
COMMANDS: dict[str, Decide] = {
    "pause": operators.pause,
    "unpause": operators.unpause,
    "cancel": operators.request_cancel,
}


@dataclass(frozen=True)
class Operator:
    """Who asks: a name and how it was authenticated (``AuthMethod``)."""

    by: str
    auth: str | None = None
    reason: str = ""


class Operators:
    """Appends operators' commands to one step log and reads them back."""

    def __init__(self, log: EventLog, events: EventFactory, history: WorkflowHistory) -> None:
        self.log = log
        self.events = events
        self.history = history

    def state(self, workflow_id: str) -> WorkflowState:
        """The workflow as the log tells it; an id the log does not hold is refused."""
        found = self.history.read(workflow_id).events
        if not found:
            raise LedgerStateError(f"no workflow {workflow_id!r} in the step log")
        return replay(workflow_id, found)

    def steer(
        self,
        command: str,
        workflow_ids: Iterable[str],
        who: Operator,
        *,
        hold_recovery: bool = False,
    ) -> list[Steer]:
        """Apply one command to each workflow; one answer per workflow, in order.

        ``hold_recovery`` (a pause only): recovery settles none of their in-doubt steps
        until the unpause."""
        decide = COMMANDS[command]
        if hold_recovery:
            if command != "pause":
                raise LedgerStateError(f"only a pause holds recovery, not {command!r}")
            decide = functools.partial(operators.pause, hold_recovery=True)
        done = []
        for workflow_id in workflow_ids:
            state = self.state(workflow_id)
            decision = decide(state, who.by, who.reason, who.auth)
            if decision.body is not None:
                fleet = state.fleet_id or self.events.fleet_id
                factory = EventFactory(fleet, self.events.producer_id, self.events.clock)
                self.log.append(factory.envelope(workflow_id, None, decision.body))
            done.append(decision)
        return done


def plan_restart(
    history: WorkflowHistory, state: WorkflowState, step_id: str, new_id: str | None
) -> RestartPlan:
    """The plan of restarting ``state``'s workflow from ``step_id`` as ``new_id`` (default
    :func:`next_restart_id`); a new id the log already holds is refused (a restart makes a
    new workflow, never writes into another)."""
    if not new_id:
        return restarting.plan(state, step_id, next_restart_id(history, state.workflow_id))
    plan = restarting.plan(state, step_id, new_id)  # what the old workflow refuses comes first
    if history.read(new_id).events:
        raise LedgerStateError(
            f"workflow {new_id!r} is in the step log already: a restart makes a new workflow",
            workflow_id=state.workflow_id,
        )
    return plan


def next_restart_id(history: WorkflowHistory, workflow_id: str) -> str:
    """The first ``ID.rN`` the log does not hold yet: a restart's new id by default."""
    for n in range(1, 100):
        candidate = f"{workflow_id}.r{n}"
        if not history.read(candidate).events:
            return candidate
    raise LedgerStateError(f"{workflow_id!r} was restarted 99 times: name the new id")


def operator_open(ledger: Ledger, workflow_id: str, reason: str, by: str) -> Workflow:
    """Open a workflow as a runner for an operator's command: the claim names ``by`` and
    counts no resumption attempt (a workflow at its limit is claimed, not dead-lettered)."""
    return opening.open_workflow(ledger, workflow_id, WorkflowSpec(reason=reason, operator=by))


def carry_cancel(ledger: Ledger, workflow_id: str, reason: str, *, by: str) -> str:
    """Carry a requested cancel through as a runner of the workflow; one line says the end.

    ``ledger`` holds the tools whose compensations run; ``by`` names the operator (the
    claim is theirs: it counts no attempt).  A workflow that ended before is
    left as it ended; a step waiting for a person (or a settling that could not finish)
    leaves it cancelling, and the line says why.
    """
    try:
        workflow = operator_open(ledger, workflow_id, f"cancel: {reason}", by)
        if workflow.state.status in ENDED:
            return f"{workflow_id}: ended {workflow.state.status.value}"
        compensation.compensate(workflow, reason)
        compensation.finish(workflow, reason, ended=WorkflowStatus.CANCELLED)
        state = workflow.state
        left = f" (escalation {state.escalation_id})" if state.escalation_id else ""
        return f"{workflow_id}: {state.status.value}{left}"
    except StepLedgerError as exc:
        return f"{workflow_id}: cancel asked, not carried through yet: {exc}"


def carry_restart(ledger: Ledger, restart: RestartPlan, reason: str, *, by: str) -> str:
    """Restart a workflow from a step as a new one (the plan :func:`restart.plan` made).

    The old workflow is opened as a runner (a running one is claimed: its runner calls
    nothing more); the undoable effects at or after the step are compensated through the
    one compensation path, the plan is made again on what the log then says (an undo that
    failed refuses it), the new workflow's head is written (its start, linked to the old
    one, and the replayed prefix), and the old one ends ``restarted``.  Run again after a
    crash, it writes the same events again (their ids are derived: duplicates change
    nothing).  ``ledger`` holds the tools whose compensations run; ``by`` names the
    operator, whose claim of the old workflow counts no attempt.
    """
    if restart.refusal is not None:
        raise LedgerStateError(restart.refusal, workflow_id=restart.old)
    old = operator_open(ledger, restart.old, f"restart as {restart.new}: {reason}", by)
    if restart.undo:
        compensation.compensate(old, reason, only={s.step_id for s in restart.undo})
    again = restarting.plan(old.state, restart.step_id, restart.new)
    if again.refusal is not None or again.undo:
        raise LedgerStateError(again.refusal or "an undo did not finish", workflow_id=again.old)
    state, events = old.state, ledger.events
    head = events.workflow_started(
        restart.new,
        name=state.name,
        attempt=1,
        read_only=False,
        max_attempts=state.max_attempts,
        restarted_from=restart.old,
        restart_step=restart.step_id,
    )
    ledger.log.append(head)
    for step_id, body in restarting.replayed_events(state, again, ledger.clock()):
        ledger.log.append(events.envelope(restart.new, step_id, body))
    end = ev.WorkflowFinished(
        status=WorkflowStatus.RESTARTED,
        detail=f"restarted from {restart.step_id} as {restart.new}: {reason}",
        restarted_as=restart.new,
        runner=old.runner if old.epoch else None,
    )
    old.record(events.envelope(restart.old, None, end))
    return f"{restart.old}: restarted as {restart.new} from {restart.step_id}"

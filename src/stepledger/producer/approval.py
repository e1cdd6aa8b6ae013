"""Approval gates: a pivot step requests a human approval of one exact call and runs only
with that call, once it is granted.

The request and the decision are events on the workflow (``approval_requested``,
``approval_decided``), so an agent may wait for the decision (bounded) or exit and be
resumed later: the gate is in the log, not in the process.  The request shows the call's
arguments as its intent will record them (secret values redacted), their digest and the
saga's state; the decision names that digest.  The digest is the call's fingerprint (tool,
step, identifying arguments with secret values as keyed HMACs;
:mod:`stepledger.domain.fingerprint`), never its idempotency key.  A later call with other
arguments, or after the tool's ``approval_valid_for``, asks again (:func:`ask_again`): a
new request voids the old one, and the pivot never runs under an approval of another call
(:mod:`stepledger.domain.approvals`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stepledger.domain import events as ev
from stepledger.domain.approval_saga import saga_json
from stepledger.domain.approvals import ApprovalGate, why_ask_again
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import ApprovalMismatchError, LedgerStateError
from stepledger.history.adapt import WorkflowReader, as_history
from stepledger.history.protocol import WorkflowHistory
from stepledger.log import EventLog

if TYPE_CHECKING:
    from stepledger.producer.session import WorkflowHandle

#: A step in these states was approved once (a failure or a not-happened asks for a retry).
_APPROVED_BEFORE = frozenset({StepStatus.APPROVED, StepStatus.FAILED, StepStatus.NOT_HAPPENED})


def request(
    workflow: WorkflowHandle,
    step_id: str,
    tool: Tool,
    arguments: Mapping[str, Any] | None = None,
    reason: str | None = None,
) -> None:
    """Append the approval request of one call of a pivot step (the same request twice is one).

    It records the arguments as the intent will (secret values redacted), their digest, the
    saga's state and the tool's ``approval_valid_for``; a step asked before gets request
    number + 1, which voids the earlier request.
    """
    wf_id, args = workflow.workflow_id, dict(arguments or {})
    with workflow.lock:
        step = workflow.state.steps.get(step_id)
        saga = saga_json(workflow.state, step_id)
    gate = None if step is None else step.approval
    number = 1 if gate is None else gate.request + 1
    # The call's fingerprint, not its idempotency key: a retry after a definite failure
    # (a new key) is still the call that was approved.
    shown, digest = workflow.ledger.events.recorded_arguments(wf_id, step_id, tool, args)
    body = ev.ApprovalRequested(
        tool=tool.name,
        reason=reason,
        arguments_json=shown,
        arguments_digest=digest,
        saga_json=saga,
        valid_for_s=math.ceil(tool.approval_valid_for or 0),
        request=number,
    )
    event = workflow.ledger.events.envelope(wf_id, step_id, body, "request", number, digest)
    workflow.record(event)


def ask_again(
    workflow: WorkflowHandle, step_id: str, tool: Tool, arguments: Mapping[str, Any]
) -> bool:
    """Request approval again when the step's gate does not cover this call; True if it did.

    A pending request covers only the call it showed, a granted approval only the call it
    named and only within the tool's ``approval_valid_for``.
    """
    step = workflow.state.steps.get(step_id)
    if not tool.requires_approval or step is None or step.approval is None:
        return False
    pending = step.status is StepStatus.AWAITING_APPROVAL
    if not pending and step.status not in _APPROVED_BEFORE:
        return False
    digest = workflow.ledger.events.fingerprint(workflow.workflow_id, step_id, tool, arguments)
    why = why_ask_again(
        step.approval,
        digest,
        now=workflow.ledger.clock(),
        valid_for_s=tool.approval_valid_for,
    )
    if why is None:
        return False
    request(workflow, step_id, tool, arguments, reason=f"asked again: {why}")
    return True


def await_decision(workflow: WorkflowHandle, step_id: str, timeout_s: float) -> StepStatus:
    """Wait up to ``timeout_s`` for a human's decision on the step; return its status."""

    def decided(event: ev.Event) -> bool:
        workflow.adopt([event])
        return workflow.state.steps[step_id].status is not StepStatus.AWAITING_APPROVAL

    if workflow.state.steps[step_id].status is StepStatus.AWAITING_APPROVAL and timeout_s > 0:
        history = workflow.ledger.history
        history.follow(workflow.workflow_id, workflow.position, decided, timeout_s)
    return workflow.state.steps[step_id].status


def decide(
    log: EventLog,
    factory: EventFactory,
    history: WorkflowHistory | WorkflowReader,
    workflow_id: str,
    step_id: str,
    *,
    granted: bool,
    by: str,
    note: str | None = None,
    digest: str | None = None,
    auth: str | None = None,
) -> ev.Event:
    """Append a human's approval or denial of a step that awaits one, and return the event.

    The decision names the digest of the call the pending request shows.  ``digest`` is the
    one the person saw (a prefix will do): when the step now awaits approval of another call,
    ApprovalMismatchError is raised and nothing is appended.
    """
    state = replay(workflow_id, as_history(history).read(workflow_id).events)
    step = state.steps.get(step_id)
    if step is None or step.status is not StepStatus.AWAITING_APPROVAL:
        where = "has no such step" if step is None else f"step is {step.status.value}"
        raise LedgerStateError(
            f"workflow {workflow_id!r} step {step_id!r} awaits no approval ({where})",
            workflow_id=workflow_id,
            step_id=step_id,
        )
    if state.fleet_id and state.fleet_id != factory.fleet_id:
        factory = EventFactory(state.fleet_id, factory.producer_id, factory.clock)
    gate = step.approval
    ensure_shown(workflow_id, step_id, gate, digest)
    body = ev.ApprovalDecided(
        granted=granted,
        by=by,
        note=note,
        arguments_digest=None if gate is None else gate.digest,
        auth=auth,
        request=0 if gate is None else gate.request,
    )
    event = factory.envelope(workflow_id, step_id, body)
    log.append(event)
    return event


def ensure_shown(
    workflow_id: str, step_id: str, gate: ApprovalGate | None, digest: str | None
) -> None:
    """Raise ApprovalMismatchError when ``digest`` (what a person saw) is not the pending call's."""
    if digest is None or not digest.strip():
        return
    pending = None if gate is None else gate.digest
    if pending is None or not pending.startswith(digest.strip()):
        raise ApprovalMismatchError(
            f"workflow {workflow_id!r} step {step_id!r} now awaits approval of call "
            f"{(pending or 'unbound')[:12]} (request {gate.request if gate else 0}), not "
            f"{digest.strip()[:12]}: the agent asked again with other arguments; look again",
            workflow_id=workflow_id,
            step_id=step_id,
        )

"""Approval gates: a pivot step requests a human approval and runs only once it is granted.

The request and the decision are events on the workflow (``approval_requested``,
``approval_decided``), so an agent may wait for the decision (bounded) or exit and be
resumed later: the gate is in the log, not in the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import LedgerStateError
from stepledger.log import EventLog
from stepledger.producer.reader import WorkflowReader

if TYPE_CHECKING:
    from stepledger.producer.workflow import Workflow


def request(workflow: Workflow, step_id: str, tool: Tool, reason: str | None = None) -> None:
    """Append the approval request of a pivot step (the same request twice is one event)."""
    body = ev.ApprovalRequested(tool=tool.name, reason=reason)
    workflow.record(workflow.ledger.events.envelope(workflow.workflow_id, step_id, body))


def await_decision(workflow: Workflow, step_id: str, timeout_s: float) -> StepStatus:
    """Wait up to ``timeout_s`` for a human's decision on the step; return its status."""

    def decided(event: ev.Event) -> bool:
        workflow.adopt([event])
        return workflow.state.steps[step_id].status is not StepStatus.AWAITING_APPROVAL

    if workflow.state.steps[step_id].status is StepStatus.AWAITING_APPROVAL and timeout_s > 0:
        reader = workflow.ledger.reader
        reader.follow(workflow.workflow_id, workflow.position, decided, timeout_s)
    return workflow.state.steps[step_id].status


def decide(
    log: EventLog,
    factory: EventFactory,
    reader: WorkflowReader,
    workflow_id: str,
    step_id: str,
    *,
    granted: bool,
    by: str,
    note: str | None = None,
) -> ev.Event:
    """Append a human's approval or denial of a step that awaits one, and return the event."""
    state = replay(workflow_id, reader.read(workflow_id))
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
    body = ev.ApprovalDecided(granted=granted, by=by, note=note)
    event = factory.envelope(workflow_id, step_id, body)
    log.append(event)
    return event

"""One workflow as the projector holds it: the shared fold state plus its escalations.

The fold (:mod:`stepledger.projector.fold`) keeps these per workflow; the row builders
(:mod:`stepledger.projector.rows`) read them; neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from stepledger.domain import events as ev
from stepledger.domain.state import Anomaly, RunStatus, WorkflowState


@dataclass
class EscalationRow:
    """An escalation as the log tells it: opened by an abandonment or a dead letter."""

    escalation_id: str
    kind: str
    step_id: str | None
    reason: str
    opened_at: datetime
    verdict: str | None = None
    resolved_by: str | None = None
    note: str | None = None
    resolved_at: datetime | None = None


class WorkflowProjection:
    """One workflow's fold state, plus the escalations and event count the tables show."""

    __slots__ = ("escalations", "events", "state")

    def __init__(self, workflow_id: str) -> None:
        self.state = WorkflowState(workflow_id)
        self.escalations: dict[str, EscalationRow] = {}
        self.events = 0

    def is_duplicate(self, event: ev.Event) -> bool:
        """True when this event (by id) was already folded in."""
        return event.event_id in self.state.seen

    def apply(self, event: ev.Event) -> Anomaly | None:
        """Fold a new event in; return the anomaly it caused, if any."""
        anomaly = self.state.apply(event)
        self.events += 1
        if anomaly is None and type(event.body) in _ESCALATING:
            self._track_escalation(event)
        return anomaly

    def _track_escalation(self, event: ev.Event) -> None:
        body, at = event.body, event.occurred_at
        if isinstance(body, ev.StepAbandoned) and body.escalation_id is not None:
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "step", event.step_id, body.reason, at
            )
        elif isinstance(body, ev.WorkflowDeadLettered):
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "workflow", None, body.reason, at
            )
        elif isinstance(body, ev.WorkflowFinished) and body.escalation_id is not None:
            # compensation_incomplete: effects left standing wait for a human's forward action.
            reason = body.left_standing_json or body.detail or ""
            self.escalations[body.escalation_id] = EscalationRow(
                body.escalation_id, "left_standing", None, reason, at
            )
        elif isinstance(body, ev.EscalationResolved):
            known = self.escalations.get(body.escalation_id)
            if known is not None:
                known.verdict, known.resolved_by = body.verdict.value, body.by
                known.note, known.resolved_at = body.note, at

    def escalation_status(self, esc: EscalationRow) -> str:
        """``open`` while the fold holds it, ``resolved`` once answered, else ``superseded``."""
        state = self.state
        if esc.kind == "workflow":
            is_open = (
                state.status is RunStatus.DEAD_LETTERED and state.escalation_id == esc.escalation_id
            )
        elif esc.kind == "left_standing":
            is_open = (
                state.status is RunStatus.COMPENSATION_INCOMPLETE
                and state.escalation_id == esc.escalation_id
            )
        else:
            step = state.steps.get(esc.step_id or "")
            is_open = (
                step is not None
                and step.escalation_open
                and step.escalation_id == esc.escalation_id
            )
        if is_open:
            return "open"
        return "resolved" if esc.verdict is not None else "superseded"


#: The event types that open or answer an escalation (every other one skips the checks).
_ESCALATING = frozenset(
    {ev.StepAbandoned, ev.WorkflowDeadLettered, ev.WorkflowFinished, ev.EscalationResolved}
)

__all__ = ["EscalationRow", "WorkflowProjection"]

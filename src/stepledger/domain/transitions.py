"""How one step event moves a step: a pure function of (step, event body, time) per type.

Each transition returns the fields it changes (the fold makes one copy of the step with
them) and, for an event that contradicts the step, the anomaly it is recorded as instead.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from stepledger.domain import approvals, ids
from stepledger.domain import events as ev
from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
)
from stepledger.domain.steps import RETRYABLE, SETTLED, StepState, StepStatus

#: An anomaly's (kind, detail).
Problem = tuple[str, str]
#: The fields a transition changes (one copy of the step is made, with ``last_at`` too).
Changes = dict[str, object]
Transition = tuple[Changes | None, Problem | None]


def _on_resolution_attempted(
    step: StepState, body: ev.ResolutionAttempted, at: datetime
) -> Transition:
    return dict(recovery_attempts=max(step.recovery_attempts, body.attempt)), None


def _on_approval_requested(step: StepState, body: ev.ApprovalRequested, at: datetime) -> Transition:
    gate = step.approval
    if gate is not None:
        # Asked again (another call, or an expired approval): the new request voids the old;
        # a denied (or running) step is never asked again.
        if step.status not in RETRYABLE:
            return None, ("late_approval_request", f"step is already {step.status}")
        problem = approvals.request_problem(gate, body)
        if problem is not None:
            return None, problem
    elif step.first_at != at and step.status is not StepStatus.INTENDED:
        return None, ("late_approval_request", f"step is already {step.status}")
    gate = approvals.requested(body, at)
    return dict(status=StepStatus.AWAITING_APPROVAL, tool=body.tool, approval=gate), None


def _on_approval_decided(step: StepState, body: ev.ApprovalDecided, at: datetime) -> Transition:
    if step.status is not StepStatus.AWAITING_APPROVAL:
        return None, ("unexpected_approval", f"approval decided for a step {step.status}")
    problem = approvals.decision_problem(step.approval, body)
    if problem is not None:  # an answer to a request a newer one voided
        return None, problem
    decided = StepStatus.APPROVED if body.granted else StepStatus.DENIED
    return dict(status=decided, approval=approvals.decided(step.approval, body, at)), None


def _on_intent(step: StepState, body: ev.StepIntended, at: datetime) -> Transition:
    fresh = step.attempt == 0
    if not fresh and step.status not in RETRYABLE:
        return None, ("intent_while_" + step.status.value, f"intent attempt {body.attempt} ignored")
    if step.escalation_open:
        # A failure escalated to a person runs again only on their verdict (not_happened).
        return None, ("intent_while_escalated", f"intent attempt {body.attempt} ignored")
    return dict(
        status=StepStatus.INTENDED,
        sequence=body.sequence,
        tool=body.tool,
        effect=body.effect,
        policy=body.policy,
        repeatable=_repeatable(body),
        undoable=body.undoable if body.undoable is not None else _legacy_undoable(body),
        after_pivot=body.after_pivot,
        idempotency_key=body.idempotency_key,
        runner=body.runner,
        epoch=body.epoch,
        arguments_json=body.arguments_json,
        arguments_digest=body.arguments_digest,
        deadline=body.deadline,
        attempt=body.attempt,
        intended_at=at,
        recovery_attempts=0,
        result_json=None,
        result_type=None,
        error=None,
        resolved_by=None,
        resolved_at=None,
    ), None


def _repeatable(body: ev.StepIntended) -> bool:
    if body.repeatable is not None:
        return body.repeatable
    # Written before 0.2.0: only the class and the policy tell (a re-drive was validated safe).
    legacy = (EffectClass.READ_ONLY, EffectClass.IDEMPOTENT)
    return body.effect in legacy or body.policy is ResolutionPolicy.REDRIVE


def _legacy_undoable(body: ev.StepIntended) -> bool:
    return body.effect is EffectClass.COMPENSATABLE


def _on_outcome(step: StepState, body: ev.StepOutcome, at: datetime) -> Transition:
    if body.attempt != step.attempt:
        detail = f"outcome for attempt {body.attempt}, step at attempt {step.attempt}"
        return None, ("stale_outcome", detail)
    if _other_runner(step, body):
        detail = f"outcome by runner {body.runner} for the intent of runner {step.runner}"
        return None, ("zombie_outcome", detail)
    if step.status is not StepStatus.INTENDED:
        kind = "late_outcome" if body.source is Source.AGENT else "second_outcome"
        return None, (
            kind,
            f"{body.status.value} from {body.source.value} after {step.status}; "
            f"the first decision stands",
        )
    status = _OUTCOME_STATUS[body.status]
    return dict(
        status=status,
        result_json=body.result_json,
        result_type=body.result_type,
        error=body.error,
        resolved_by=body.source,
        resolved_at=at,
    ), None


def _other_runner(step: StepState, body: ev.StepOutcome) -> bool:
    """An agent's outcome of an effectful intent that another runner wrote (a zombie's call)."""
    if body.source is not Source.AGENT or body.runner is None or step.runner is None:
        return False
    return body.runner != step.runner and step.effect is not EffectClass.READ_ONLY


def _on_compensation_intended(
    step: StepState, body: ev.CompensationIntended, at: datetime
) -> Transition:
    """A compensation is a claim: only the first decision on the step's attempt may make it.

    An agent undoes a step that succeeded (a saga unwinding); recovery undoes a step that is
    still in doubt, at the attempt its key names.  A compensation that arrives after another
    decision (an outcome found by a query, an earlier compensation, an abandonment) or for
    an earlier attempt lost the race: it is recorded as an anomaly and its hook never runs.
    """
    if body.idempotency_key != ids.compensation_key(step.idempotency_key) or (
        body.attempt and body.attempt != step.attempt
    ):
        # An attempt that kept its key after a "not happened" shares its compensation key
        # with the one before: the attempt tells a late claim of the earlier one apart.
        detail = f"compensation key is not the one of attempt {step.attempt}"
        return None, ("stale_compensation", detail)
    expected = StepStatus.SUCCEEDED if body.source is Source.AGENT else StepStatus.INTENDED
    if step.status is not expected:
        return None, (
            "compensation_after_decision",
            f"{body.source.value} compensation of a step that is {step.status}; "
            "the first decision stands",
        )
    return dict(
        status=StepStatus.COMPENSATING,
        compensation_key=body.idempotency_key,
        resolved_by=body.source,
    ), None


def _on_compensation_outcome(
    step: StepState, body: ev.CompensationOutcome, at: datetime
) -> Transition:
    if step.status is not StepStatus.COMPENSATING:
        return None, ("compensation_outcome_without_intent", f"step is {step.status}")
    if body.status is CompensationStatus.FAILED:
        return dict(status=StepStatus.COMPENSATION_FAILED, error=body.error, resolved_at=at), None
    return dict(status=StepStatus.COMPENSATED, resolved_by=body.source, resolved_at=at), None


def _on_abandoned(step: StepState, body: ev.StepAbandoned, at: datetime) -> Transition:
    if step.status in SETTLED:
        if body.escalation_id is not None and _escalates_settled(step, body):
            # A conflict found after the decision (e.g. a late outcome), or a definite failure
            # after the pivot that may not be retried on its own: the decision stands and the
            # step waits for a human's verdict, which re-judges it.
            return dict(escalation_id=body.escalation_id, escalation_open=True), None
        return None, ("abandon_settled", f"abandonment of a step already {step.status}")
    return dict(
        status=StepStatus.ABANDONED,
        resolved_by=body.source,
        escalation_id=body.escalation_id,
        escalation_open=body.escalation_id is not None,
        resolved_at=at,
    ), None


def _escalates_settled(step: StepState, body: ev.StepAbandoned) -> bool:
    """Recovery escalates a conflict on any decided step; an agent only its own failure."""
    if body.source is not Source.AGENT:
        return True
    return step.status is StepStatus.FAILED and not step.escalation_open


_VERDICT_STATUS = {
    Verdict.HAPPENED: StepStatus.SUCCEEDED,
    Verdict.NOT_HAPPENED: StepStatus.NOT_HAPPENED,
    Verdict.COMPENSATED: StepStatus.COMPENSATED,
}


def _on_escalation_resolved(
    step: StepState, body: ev.EscalationResolved, at: datetime
) -> Transition:
    if not step.escalation_open or body.escalation_id != step.escalation_id:
        return None, ("unknown_escalation", f"step has no open escalation {body.escalation_id}")
    if body.verdict is Verdict.CLEARED:
        return None, ("bad_verdict", "'cleared' answers a workflow escalation, not a step")
    return dict(
        status=_VERDICT_STATUS[body.verdict],
        escalation_open=False,
        result_json=body.result_json or step.result_json,
        resolved_by=Source.HUMAN,
        resolved_at=at,
    ), None


_OUTCOME_STATUS = {status: StepStatus(status.value) for status in OutcomeStatus}
#: The step transition of each step event type (dispatch by type: an isinstance chain cost
#: more than the transition itself).
TRANSITIONS: dict[type[object], Callable[[StepState, Any, datetime], Transition]] = {
    ev.StepIntended: _on_intent,
    ev.StepOutcome: _on_outcome,
    ev.CompensationIntended: _on_compensation_intended,
    ev.CompensationOutcome: _on_compensation_outcome,
    ev.StepAbandoned: _on_abandoned,
    ev.ResolutionAttempted: _on_resolution_attempted,
    ev.EscalationResolved: _on_escalation_resolved,
    ev.ApprovalRequested: _on_approval_requested,
    ev.ApprovalDecided: _on_approval_decided,
}

"""One case of the human queue, built from its workflow's events by the domain's fold (pure).

A case is an escalation (a step or a dead-lettered workflow waiting for a verdict) or a
pending approval (a pivot step waiting to be allowed to run).  Everything shown comes from
the log: the steps in order, the intent of the step in question, every recovery attempt
with its evidence, why it escalated, and the decisions.  The fold decides which answer
counted: the first one it applies; a later one is recorded as an anomaly, shown here as
an answer that came too late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, ResolutionPolicy, Verdict
from stepledger.domain.ids import loads_or_text
from stepledger.domain.spend import spend_of
from stepledger.domain.state import RunStatus, StepState, StepStatus, WorkflowState
from stepledger.humanqueue.escalations import STANDING_VERDICTS, WORKFLOW_VERDICTS, step_options
from stepledger.humanqueue.shown import Redactor, ShownCall, shown_call


class CaseKind(StrEnum):
    """What a person is asked."""

    STEP = "step"
    """Did an in-doubt step's effect happen?"""
    WORKFLOW = "workflow"
    """May a dead-lettered workflow run again?"""
    APPROVAL = "approval"
    """May a pivot step run?"""


class Answer(StrEnum):
    """Every answer a case may take (a verdict, or an approval's decision)."""

    HAPPENED = Verdict.HAPPENED.value
    NOT_HAPPENED = Verdict.NOT_HAPPENED.value
    COMPENSATED = Verdict.COMPENSATED.value
    CLEARED = Verdict.CLEARED.value
    APPROVE = "approve"
    DENY = "deny"


POLICY_TEXT: dict[ResolutionPolicy, str] = {
    ResolutionPolicy.ESCALATE: (
        "escalate: the tool can neither be looked up nor safely repeated, so recovery never "
        "decides an in-doubt call of it; a person does"
    ),
    ResolutionPolicy.QUERY: (
        "query: recovery asks the service whether the call's idempotency key took effect; it "
        "escalates when no answer could be had within the attempt limit"
    ),
    ResolutionPolicy.REDRIVE: (
        "redrive: recovery calls again with the same idempotency key; it escalates when the "
        "re-drives keep failing"
    ),
    ResolutionPolicy.COMPENSATE: (
        "compensate: recovery undoes the call; it escalates when the compensation keeps failing"
    ),
}

EFFECT_TEXT: dict[EffectClass, str] = {
    EffectClass.READ_ONLY: "read-only: calling it changes nothing",
    EffectClass.IDEMPOTENT: "idempotent: a repeat with the same key does nothing more",
    EffectClass.COMPENSATABLE: "compensatable: its effect can be undone by a compensation",
    EffectClass.IRREVERSIBLE: "irreversible: once it happened nothing undoes it",
}


@dataclass(frozen=True)
class StepView:
    """One step of the workflow as the log tells it, arguments as recorded (secrets redacted)."""

    step_id: str
    sequence: int
    status: str
    tool: str
    effect: str
    policy: str
    attempt: int
    recovery_attempts: int
    idempotency_key: str
    arguments: Any
    result: Any
    error: str | None
    resolved_by: str
    deadline: datetime | None
    intended_at: datetime | None
    resolved_at: datetime | None
    first_at: datetime | None


@dataclass(frozen=True)
class Probe:
    """One recovery attempt on the step: the policy tried, the tool's answer or the hook error."""

    step_id: str | None
    policy: str
    attempt: int
    answer: Any
    error: str | None
    at: datetime


@dataclass(frozen=True)
class Decision:
    """A person's answer as the log holds it."""

    event_id: str
    answer: Answer
    by: str
    note: str
    at: datetime
    result: Any = None
    counted: bool = True
    """False when the fold refused it: an earlier answer had already decided the case."""
    detail: str = ""
    auth: str = ""
    """How its author was authenticated (``AuthMethod``; empty for answers before 0.3)."""
    digest: str = ""
    """For an approval: the digest of the call it decided on."""


@dataclass(frozen=True)
class Case:
    """Everything a person needs to answer one escalation or approval, from the log."""

    kind: CaseKind
    case_id: str
    workflow_id: str
    step_id: str | None
    fleet_id: str
    workflow_status: str
    workflow_attempt: int
    workflow_max_attempts: int
    reason: str
    opened_at: datetime | None
    is_open: bool
    options: tuple[Answer, ...]
    steps: tuple[StepView, ...]
    subject: StepView | None
    evidence: Any = None
    probes: tuple[Probe, ...] = ()
    anomalies: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()
    shown: ShownCall | None = None
    """For an approval: the call the pending (or decided) request shows."""
    spend: str = ""
    """What the workflow's model turns cost, and what resumes reused (empty: no turn)."""

    @property
    def decision(self) -> Decision | None:
        """The answer that counted (the first one the fold applied), if any."""
        return next((d for d in self.decisions if d.counted), None)

    @property
    def late(self) -> tuple[Decision, ...]:
        """Answers the fold refused because the case was already decided."""
        return tuple(d for d in self.decisions if not d.counted)

    @property
    def policy_text(self) -> str:
        """Why a step of this tool escalates, from its declared policy."""
        if self.subject is None or not self.subject.policy:
            return ""
        return POLICY_TEXT.get(ResolutionPolicy(self.subject.policy), self.subject.policy)

    @property
    def effect_text(self) -> str:
        """What the step's tool does to the world, from its declared effect class."""
        if self.subject is None or not self.subject.effect:
            return ""
        return EFFECT_TEXT.get(EffectClass(self.subject.effect), self.subject.effect)

    @property
    def before(self) -> tuple[StepView, ...]:
        """Steps recorded before the subject step."""
        return self.steps[: self._index()]

    @property
    def after(self) -> tuple[StepView, ...]:
        """Steps recorded after the subject step."""
        return self.steps[self._index() + 1 :] if self.subject is not None else ()

    @property
    def standing(self) -> tuple[StepView, ...]:
        """Compensatable steps before a pivot that happened: a pivot leaves them standing."""
        return tuple(
            s
            for s in self.before
            if s.effect == EffectClass.COMPENSATABLE.value
            and s.status == StepStatus.SUCCEEDED.value
        )

    def _index(self) -> int:
        ids = [s.step_id for s in self.steps]
        return ids.index(self.subject.step_id) if self.subject in self.steps else len(ids)


@dataclass
class _Trace:
    """What the fold alone does not keep: times, reasons, probes and each answer's verdict."""

    reason: str = ""
    opened_at: datetime | None = None
    evidence: Any = None
    step_id: str | None = None
    found: bool = False
    standing: bool = False
    """The escalation lists effects a compensation left standing."""
    probes: list[Probe] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)


def escalation_case(
    workflow_id: str,
    escalation_id: str,
    events: Sequence[ev.Event],
    redactor: Redactor | None = None,
) -> Case | None:
    """The case of one escalation of a workflow; None when the log has no such escalation."""
    state = WorkflowState(workflow_id)
    trace = _Trace()
    for event in events:
        anomaly = state.apply(event)
        _trace_escalation(trace, event, escalation_id, anomaly)
    if not trace.found:
        return None
    if trace.step_id is None:
        waiting = state.status in (RunStatus.DEAD_LETTERED, RunStatus.COMPENSATION_INCOMPLETE)
        is_open = waiting and state.escalation_id == escalation_id
        standing = state.status is RunStatus.COMPENSATION_INCOMPLETE or trace.standing
        options = STANDING_VERDICTS if standing else WORKFLOW_VERDICTS
        case = _case(CaseKind.WORKFLOW, escalation_id, state, trace, is_open, options)
        return _spent(case, state, events)
    step = state.steps.get(trace.step_id)
    is_open = step is not None and step.escalation_open and step.escalation_id == escalation_id
    verdicts = step_options(step)
    case = _case(CaseKind.STEP, escalation_id, state, trace, is_open, verdicts, redactor)
    return _spent(case, state, events)


def approval_case(
    workflow_id: str,
    step_id: str,
    events: Sequence[ev.Event],
    redactor: Redactor | None = None,
) -> Case | None:
    """The case of a step's approval; None when the step never requested one."""
    state = WorkflowState(workflow_id)
    trace = _Trace(step_id=step_id)
    for event in events:
        anomaly = state.apply(event)
        if event.step_id == step_id:
            _trace_approval(trace, event, anomaly)
    if not trace.found:
        return None
    step = state.steps.get(step_id)
    is_open = step is not None and step.status is StepStatus.AWAITING_APPROVAL
    options = (Answer.APPROVE, Answer.DENY)
    case = _case(
        CaseKind.APPROVAL,
        approval_key(workflow_id, step_id),
        state,
        trace,
        is_open,
        options,
        redactor,
    )
    return _spent(replace(case, shown=shown_call(step, redactor)), state, events)


def _spent(case: Case, state: WorkflowState, events: Sequence[ev.Event]) -> Case:
    spend = spend_of(state, events)
    return replace(case, spend=spend.line()) if spend.turns_incurred else case


def approval_key(workflow_id: str, step_id: str) -> str:
    """How an approval case is named (approvals carry no id of their own)."""
    return f"approval:{workflow_id}/{step_id}"


def _trace_escalation(
    trace: _Trace, event: ev.Event, escalation_id: str, anomaly: object | None
) -> None:
    body = event.body
    if isinstance(body, ev.WorkflowFinished):
        # A compensation that left effects standing: the escalation lists them.
        if body.escalation_id == escalation_id and not trace.found:
            trace.found, trace.step_id, trace.standing = True, None, True
            trace.reason, trace.opened_at = body.detail or "", event.occurred_at
            trace.evidence = {"left_standing": loads_or_text(body.left_standing_json)}
    elif isinstance(body, ev.StepAbandoned | ev.WorkflowDeadLettered):
        if body.escalation_id == escalation_id and not trace.found:
            trace.found, trace.step_id = True, event.step_id
            trace.reason, trace.opened_at = body.reason, event.occurred_at
            trace.evidence = loads_or_text(getattr(body, "evidence_json", None))
    elif isinstance(body, ev.ResolutionAttempted):
        # Probes come before the abandonment that names the step: every step's are kept,
        # and the case shows its own step's.
        trace.probes.append(_probe(event, body))
    elif isinstance(body, ev.EscalationResolved) and body.escalation_id == escalation_id:
        trace.decisions.append(_verdict(event, body, anomaly))


def _trace_approval(trace: _Trace, event: ev.Event, anomaly: object | None) -> None:
    body = event.body
    if isinstance(body, ev.ApprovalRequested) and anomaly is None:
        # The newest request is the case: a request asked again voids the earlier ones.
        trace.found, trace.opened_at = True, event.occurred_at
        trace.reason = body.reason or f"{body.tool} is a pivot: it runs only once approved"
        earlier = f"answered request {body.request - 1}; the agent asked again since"
        trace.decisions = [replace(d, counted=False, detail=earlier) for d in trace.decisions]
    elif isinstance(body, ev.ApprovalDecided):
        answer = Answer.APPROVE if body.granted else Answer.DENY
        trace.decisions.append(
            Decision(
                event.event_id,
                answer,
                body.by,
                body.note or "",
                event.occurred_at,
                counted=anomaly is None,
                detail=_detail(anomaly),
                auth=body.auth or "",
                digest=body.arguments_digest or "",
            )
        )
    elif isinstance(body, ev.ResolutionAttempted):
        trace.probes.append(_probe(event, body))


def _probe(event: ev.Event, body: ev.ResolutionAttempted) -> Probe:
    answer = loads_or_text(body.answer_json)
    return Probe(
        event.step_id, body.policy.value, body.attempt, answer, body.error, event.occurred_at
    )


def _verdict(event: ev.Event, body: ev.EscalationResolved, anomaly: object | None) -> Decision:
    return Decision(
        event.event_id,
        Answer(body.verdict.value),
        body.by,
        body.note,
        event.occurred_at,
        result=loads_or_text(body.result_json),
        counted=anomaly is None,
        detail=_detail(anomaly),
        auth=body.auth or "",
    )


def _detail(anomaly: object | None) -> str:
    return "" if anomaly is None else str(getattr(anomaly, "detail", anomaly))


def _case(
    kind: CaseKind,
    case_id: str,
    state: WorkflowState,
    trace: _Trace,
    is_open: bool,
    options: Sequence[Verdict | Answer],
    redactor: Redactor | None = None,
) -> Case:
    steps = tuple(_view(s, redactor) for s in _in_order(state))
    subject = next((s for s in steps if s.step_id == trace.step_id), None)
    probes = tuple(p for p in trace.probes if p.step_id == trace.step_id)
    anomalies = tuple(
        f"{a.kind}: {a.detail}" for a in state.anomalies if a.step_id == trace.step_id
    )
    return Case(
        kind=kind,
        case_id=case_id,
        workflow_id=state.workflow_id,
        step_id=trace.step_id,
        fleet_id=state.fleet_id,
        workflow_status=state.status.value,
        workflow_attempt=state.attempt,
        workflow_max_attempts=state.max_attempts,
        reason=trace.reason,
        opened_at=trace.opened_at,
        is_open=is_open,
        options=tuple(Answer(o.value) for o in options),
        steps=steps,
        subject=subject,
        evidence=trace.evidence,
        probes=probes,
        anomalies=anomalies,
        decisions=tuple(trace.decisions),
    )


def _in_order(state: WorkflowState) -> list[StepState]:
    # The fold keeps steps in the order the log first named them; a step awaiting approval
    # has no intent (so no sequence) yet, and sits where it was asked.
    return list(state.steps.values())


def _view(step: StepState, redactor: Redactor | None) -> StepView:
    recorded = step.arguments_json
    if step.attempt == 0 and step.approval is not None and step.approval.arguments_json:
        recorded = step.approval.arguments_json  # no intent yet: the call its request shows
    arguments = loads_or_text(recorded)
    if redactor is not None and isinstance(arguments, dict) and step.tool:
        arguments = redactor(step.tool, arguments)
    return StepView(
        step_id=step.step_id,
        sequence=step.sequence,
        status=step.status.value,
        tool=step.tool,
        effect="" if step.effect is None else step.effect.value,
        policy="" if step.policy is None else step.policy.value,
        attempt=step.attempt,
        recovery_attempts=step.recovery_attempts,
        idempotency_key=step.idempotency_key,
        arguments=arguments,
        result=loads_or_text(step.result_json),
        error=step.error,
        resolved_by="" if step.resolved_by is None else step.resolved_by.value,
        deadline=step.deadline,
        intended_at=step.intended_at,
        resolved_at=step.resolved_at,
        first_at=step.first_at,
    )

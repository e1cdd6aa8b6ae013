"""The human queue: escalations read from the log, and a human's answer appended to it.

The queue is rebuilt by reading the whole topic and folding it (always correct, always
available, O(log) per call: fine for a command a human runs).  A step escalation is a
step with an open escalation (abandoned by recovery, or a conflict found after its
decision); a workflow escalation is a dead-lettered workflow, or one whose compensation
left effects standing (``compensation_incomplete``: answered ``compensated`` once a human
took the forward actions it lists, or ``cleared`` to accept them).  Answering appends an
``EscalationResolved`` event: the fold re-judges the step from it, nobody edits state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, Verdict
from stepledger.domain.factory import EventFactory
from stepledger.domain.ids import loads_or_text
from stepledger.domain.state import RunStatus, StepState, WorkflowState
from stepledger.errors import LedgerStateError, UnknownEscalationError
from stepledger.kafka.reader import read_topic
from stepledger.log import EventLog

STEP_VERDICTS = (Verdict.HAPPENED, Verdict.NOT_HAPPENED, Verdict.COMPENSATED)
#: A step whose effect nothing undoes (an email): "happened and was undone" is no answer.
FINAL_VERDICTS = (Verdict.HAPPENED, Verdict.NOT_HAPPENED)
WORKFLOW_VERDICTS = (Verdict.CLEARED,)
#: Effects a compensation left standing: a human took the forward actions, or accepts them.
STANDING_VERDICTS = (Verdict.COMPENSATED, Verdict.CLEARED)
#: The workflow statuses that wait for a human, and the answers each takes.
_WORKFLOW_OPTIONS = {
    RunStatus.DEAD_LETTERED: WORKFLOW_VERDICTS,
    RunStatus.COMPENSATION_INCOMPLETE: STANDING_VERDICTS,
}


@dataclass(frozen=True)
class OpenEscalation:
    """One open escalation with everything a human needs to answer it."""

    escalation_id: str
    workflow_id: str
    step_id: str | None
    fleet_id: str
    tool: str
    reason: str
    opened_at: datetime | None
    status: str
    """The step's (or workflow's) status as the log tells it now."""
    idempotency_key: str = ""
    arguments: Any = None
    """The intent's arguments, secrets redacted as the tool declared."""
    evidence: Any = None
    probes: tuple[dict[str, Any], ...] = ()
    """What recovery tried on the step and what the tool answered."""
    anomalies: tuple[dict[str, Any], ...] = ()
    """Late outcomes and other contradictions recorded for the step."""
    options: tuple[Verdict, ...] = STEP_VERDICTS

    def age(self, now: datetime) -> timedelta:
        """How long the escalation has been open."""
        return timedelta(0) if self.opened_at is None else now - self.opened_at

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "escalation_id": self.escalation_id,
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
            "fleet_id": self.fleet_id,
            "tool": self.tool,
            "reason": self.reason,
            "opened_at": None if self.opened_at is None else self.opened_at.isoformat(),
            "status": self.status,
            "idempotency_key": self.idempotency_key,
            "arguments": self.arguments,
            "evidence": self.evidence,
            "probes": list(self.probes),
            "anomalies": list(self.anomalies),
            "options": [v.value for v in self.options],
        }


@dataclass
class _StepNotes:
    reason: str = ""
    opened_at: datetime | None = None
    evidence: Any = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)


def step_options(step: StepState | None) -> tuple[Verdict, ...]:
    """The verdicts an in-doubt step's escalation takes, from its tool's declared effect.

    ``compensated`` only for an effect that can be undone (the tool declared a compensation,
    or the compensatable effect class), or one whose intent declared nothing (written before
    effect classes were recorded).  The one rule of the inbox's buttons and of ``escalations
    resolve``: both go through :func:`answer`, which refuses any other verdict.
    """
    if step is None or step.effect is None or step.undoable:
        return STEP_VERDICTS
    return STEP_VERDICTS if step.effect is EffectClass.COMPENSATABLE else FINAL_VERDICTS


class EscalationQueue:
    """Folds a log into workflow states plus the notes escalations show."""

    def __init__(self) -> None:
        self.workflows: dict[str, WorkflowState] = {}
        self._notes: dict[tuple[str, str | None], _StepNotes] = {}

    def apply(self, event: ev.Event) -> None:
        """Fold one event in."""
        state = self.workflows.get(event.workflow_id)
        if state is None:
            state = self.workflows[event.workflow_id] = WorkflowState(event.workflow_id)
        if event.event_id in state.seen:
            return
        state.apply(event)
        self._note(event)

    def extend(self, events: Iterable[ev.Event]) -> EscalationQueue:
        """Fold many events in and return the queue."""
        for event in events:
            self.apply(event)
        return self

    def _note(self, event: ev.Event) -> None:
        notes = self._notes.setdefault((event.workflow_id, event.step_id), _StepNotes())
        body = event.body
        if isinstance(body, ev.StepIntended):
            notes.probes.clear()
        elif isinstance(body, ev.ResolutionAttempted):
            notes.probes.append(
                {
                    "policy": body.policy.value,
                    "attempt": body.attempt,
                    "answer": loads_or_text(body.answer_json),
                    "error": body.error,
                    "at": event.occurred_at.isoformat(),
                }
            )
        elif isinstance(body, ev.StepAbandoned | ev.WorkflowDeadLettered):
            notes.reason, notes.opened_at = body.reason, event.occurred_at
            notes.evidence = loads_or_text(getattr(body, "evidence_json", None))
        elif isinstance(body, ev.WorkflowFinished) and body.escalation_id is not None:
            notes.reason, notes.opened_at = body.detail or "", event.occurred_at
            notes.evidence = {"left_standing": loads_or_text(body.left_standing_json)}
        elif isinstance(body, ev.AnomalyObserved):
            notes.anomalies.append(
                {
                    "kind": body.kind,
                    "detail": loads_or_text(body.detail),
                    "source": body.source.value,
                }
            )

    def open(self) -> list[OpenEscalation]:
        """Every open escalation, oldest first."""
        found = [e for wf in self.workflows.values() for e in self._of(wf)]
        return sorted(found, key=lambda e: (e.opened_at is None, e.opened_at or 0, e.escalation_id))

    def get(self, escalation_id: str) -> OpenEscalation:
        """The open escalation with that id; UnknownEscalationError if none is open."""
        for escalation in self.open():
            if escalation.escalation_id == escalation_id:
                return escalation
        raise UnknownEscalationError(f"no open escalation {escalation_id!r}")

    def _of(self, wf: WorkflowState) -> list[OpenEscalation]:
        found = [self._step(wf, s) for s in wf.steps.values() if s.escalation_open]
        options = _WORKFLOW_OPTIONS.get(wf.status)
        if options is not None and wf.escalation_id:
            notes = self._notes.get((wf.workflow_id, None), _StepNotes())
            found.append(
                OpenEscalation(
                    wf.escalation_id,
                    wf.workflow_id,
                    None,
                    wf.fleet_id,
                    "",
                    notes.reason,
                    notes.opened_at,
                    wf.status.value,
                    evidence=notes.evidence,
                    options=options,
                )
            )
        return found

    def _step(self, wf: WorkflowState, step: StepState) -> OpenEscalation:
        notes = self._notes.get((wf.workflow_id, step.step_id), _StepNotes())
        return OpenEscalation(
            escalation_id=step.escalation_id or "",
            workflow_id=wf.workflow_id,
            step_id=step.step_id,
            fleet_id=wf.fleet_id,
            tool=step.tool,
            reason=notes.reason,
            opened_at=notes.opened_at,
            status=step.status.value,
            idempotency_key=step.idempotency_key,
            arguments=loads_or_text(step.arguments_json),
            evidence=notes.evidence,
            probes=tuple(notes.probes),
            anomalies=tuple(notes.anomalies),
            options=step_options(step),
        )


def read_queue(settings: Settings, codec: Codec, *, max_time: float = 300.0) -> EscalationQueue:
    """Read the whole topic and fold it into the queue (undecodable records are skipped)."""
    queue = EscalationQueue()
    for record in read_topic(settings, codec, idle_timeout=0.1, max_time=max_time):
        if record.event is not None:
            queue.apply(record.event)
    return queue


def select(
    escalations: Iterable[OpenEscalation],
    *,
    now: datetime,
    fleet: str | None = None,
    tool: str | None = None,
    older_than: timedelta | None = None,
) -> list[OpenEscalation]:
    """Filter escalations by fleet, tool and minimum age."""
    return [
        e
        for e in escalations
        if (fleet is None or e.fleet_id == fleet)
        and (tool is None or e.tool == tool)
        and (older_than is None or e.age(now) >= older_than)
    ]


def answer(
    log: EventLog,
    factory: EventFactory,
    escalation: OpenEscalation,
    verdict: Verdict,
    *,
    by: str,
    note: str = "",
    result: Any = None,
    auth: str | None = None,
) -> ev.Event:
    """Append a human's answer to an escalation; the step (or workflow) is re-judged from it.

    ``auth`` records how the author ``by`` was authenticated (``AuthMethod``).
    """
    if verdict not in escalation.options:
        allowed = ", ".join(v.value for v in escalation.options)
        why = ""
        if verdict is Verdict.COMPENSATED and escalation.step_id is not None:
            why = f" ({escalation.tool} declares no way to undo its effect)"
        raise LedgerStateError(
            f"escalation {escalation.escalation_id} takes {allowed}, not {verdict.value}{why}",
            workflow_id=escalation.workflow_id,
            step_id=escalation.step_id,
        )
    if result is not None and verdict is not Verdict.HAPPENED:
        raise LedgerStateError("a result goes only with the verdict 'happened'")
    body = ev.EscalationResolved(
        escalation_id=escalation.escalation_id,
        verdict=verdict,
        result_json=None if result is None else json.dumps(result, sort_keys=True),
        note=note,
        by=by,
        auth=auth,
    )
    if escalation.fleet_id and escalation.fleet_id != factory.fleet_id:
        factory = EventFactory(escalation.fleet_id, factory.producer_id, factory.clock)
    event = factory.envelope(escalation.workflow_id, escalation.step_id, body)
    log.append(event)
    return event

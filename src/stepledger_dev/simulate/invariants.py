"""The invariants, checked after every turn (and the liveness one when the run settles).

Each is named; a violation names it, the workflow and one line of evidence.  They read the
broker's records (with who wrote each, and the broker's time), the services' effects (who
made each, for which logical call) and what actors hold; nothing here changes the run.

``effect_once``
    No logical call's effect happens twice (the services count real effects per logical
    call: a replayed key is no effect).  Read-only calls are not counted.
``intent_before_effect``
    An agent's call happens only after its intent (same idempotency key) is in the log.
``effect_under_open_intent``
    A call that is not safe to repeat runs under its own intent while the log still holds
    that intent as the step's open attempt: not fenced off by a newer claim, not decided by
    anyone else yet.
``no_early_decision``
    Nobody but the agent decides an intent before its deadline as the agent measured it,
    on the broker's clock (its budget began when it stamped the intent, before the
    append: the recorded deadline taken to the broker's clock by the writer's skew then);
    a query that *found* the effect may.
``decided_within_bound``
    Every intent is decided (an outcome, a compensation, an escalation) by its deadline by
    the broker's clock plus the grace and a margin (longer by any time the recovery daemon
    was down); checked when the run settles.
``compensation_by_owner``
    A compensation runs only under a ``compensation_intended`` that the log took as the
    step's decision, written before the workflow ended and, when an agent wrote it, while
    that agent's claim owned the workflow (whoever carries the decision out: the claim's
    writer after a takeover it preceded, a resumed process, the daemon); never by a writer
    whose own claim the log refused.
``approval_covers_call``
    A call that needs approval runs only as the call a person approved (secret values
    included: the person approved the call they were shown, card and all).
``projection_is_fold``
    The projector's state of a workflow equals the fold of the log it has read.
``log_isolation``
    Nothing of one log is applied to another: a workflow handle, a history read (a tail
    completed from a checkpoint after retention) and a checkpoint this log's checkpointer
    writes hold only events of this log.
``no_crash``
    No actor dies of an unexpected exception: an agent ends on stepledger's own errors as an
    application would; a daemon, the checkpointer or a person's tool dying of any is one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger_dev.simulate import services as sv
from stepledger_dev.simulate.scheduler import EPOCH
from stepledger_dev.simulate.simlog import Broker, Record
from stepledger_dev.simulate.statetopic import MemRecord, checkpoint_events

INVARIANTS = (
    "effect_once",
    "intent_before_effect",
    "effect_under_open_intent",
    "no_early_decision",
    "decided_within_bound",
    "compensation_by_owner",
    "approval_covers_call",
    "projection_is_fold",
    "log_isolation",
    "no_crash",
)
_UNDO_KINDS = frozenset({"refund", "cancel"})
_ACTIONABLE = (StepStatus.INTENDED, StepStatus.COMPENSATING)


@dataclass(frozen=True)
class Violation:
    """One invariant broken: which, where, and the evidence in one line."""

    invariant: str
    workflow: str
    detail: str
    ms: int

    def line(self) -> str:
        """The violation as one line."""
        return f"{self.invariant}: {self.workflow or '-'}: {self.detail} (t={self.ms}ms)"


class Monitor:
    """Checks the invariants against what the broker and the services hold."""

    def __init__(self, broker: Broker, services: sv.Services, agents: set[str]) -> None:
        self.broker = broker
        self.services = services
        self.agents = agents
        """Names of agent actors (a settling agent's compensation is an owner's)."""
        self.event_ids: set[str] = set()
        self.shown: dict[str, dict[str, object]] = {}
        """The call a person approving a request is shown, by the request's event id."""
        self.found: list[Violation] = []
        self._effects = 0
        broker.on_append.append(self._on_record)

    # -- records -------------------------------------------------------------------------

    def _on_record(self, record: Record) -> None:
        event = record.event
        if event is None:
            return
        self.event_ids.add(event.event_id)
        if event.step_id is not None and _decides(event):
            self._check_decision(record, event)

    def _check_decision(self, record: Record, event: ev.Event) -> None:
        intent = self._taken_intent(record, event)
        if intent is None or intent.event is None:
            return  # the fold refused the decision (the step was decided): it decides nothing
        body = intent.event.body
        assert isinstance(body, ev.StepIntended)
        due_ms = self._deadline_ms(intent, body)
        if record.broker_ms < due_ms:
            early = due_ms - record.broker_ms
            who = "agent" if record.writer in self.agents else "recovery daemon"
            self._add(
                "no_early_decision",
                event.workflow_id,
                f"{who} {record.writer} wrote {event.type} on {event.step_id} (attempt "
                f"{body.attempt}) {early}ms before its deadline by the broker's clock",
            )

    def _deadline_ms(self, intent: Record, body: ev.StepIntended) -> int:
        """When the intent's writer stopped calling, on the broker's clock.

        Its budget began when it stamped the intent, before the append (a writer paused in
        between appends late and calls nothing: past its deadline): the recorded deadline
        taken to the broker's clock by the writer's skew when it stamped it.  The broker's
        time of the append plus the timeout is later, and stands in when the stamp cannot
        be placed (a writer not known here).
        """
        assert intent.event is not None
        ms = timedelta(milliseconds=1)
        timeout = (body.deadline - intent.event.occurred_at) // ms
        writer = self.broker.sched.actors.get(intent.writer)
        stamped = None
        if writer is not None:
            stamped = writer.on_broker_clock((intent.event.occurred_at - EPOCH) // ms)
        if stamped is None or stamped > intent.broker_ms:
            return intent.broker_ms + timeout
        return stamped + timeout

    def _taken_intent(self, record: Record, event: ev.Event) -> Record | None:
        """The intent a decision the fold took decides (None: the fold refused it)."""
        state = WorkflowState(event.workflow_id)
        intents: dict[int, Record] = {}
        for other in self.broker.workflow_records(event.workflow_id, whole=True):
            e = other.event
            if e is None:
                continue
            if e.event_id in state.seen:
                if other is record:
                    return None  # the same decision again (one id per decided attempt)
                continue  # a duplicate delivery: the fold takes each event once
            if other is record:
                before = state.steps.get(event.step_id or "")
                if before is None or before.status is not StepStatus.INTENDED:
                    return None  # decided already: this decides nothing about the call
            anomaly = state.apply(e)
            if other is record:
                break
            intended = e.step_id == event.step_id and isinstance(e.body, ev.StepIntended)
            if intended and anomaly is None:
                assert isinstance(e.body, ev.StepIntended)
                intents[e.body.attempt] = other
        else:
            return None
        if anomaly is not None:
            return None
        step = state.steps.get(event.step_id or "")
        return None if step is None else intents.get(step.attempt)

    # -- effects -------------------------------------------------------------------------

    def after_turn(self) -> None:
        """Check every effect made since the last turn."""
        effects = self.services.effects
        while self._effects < len(effects):
            self._check_effect(effects[self._effects])
            self._effects += 1

    def _check_effect(self, effect: sv.Effect) -> None:
        workflow = effect.ref.split("/")[0]
        count = self.services.counts[(effect.ref, effect.kind)]
        if count > 1:
            self._add("effect_once", workflow, f"{effect.kind} of {effect.ref} made {count} times")
        if effect.kind in _UNDO_KINDS:
            self._check_undo(effect, workflow)
            return
        if effect.actor not in self.agents:
            return
        intent = self._intent_by_key(workflow, effect.key, None)
        if intent is None:
            self._add(
                "intent_before_effect",
                workflow,
                f"{effect.actor} made {effect.kind} of {effect.ref} with no intent in the log",
            )
            return
        if effect.tool in sv.NOT_REPEATABLE:
            own = self._intent_by_key(workflow, effect.key, effect.actor)
            if own is None:
                self._add(
                    "effect_under_open_intent",
                    workflow,
                    f"{effect.actor} made {effect.kind} of {effect.ref} under another's intent",
                )
            else:
                self._check_open(effect, workflow, own)
        if effect.tool == sv.PAY:
            self._check_approval(effect, workflow, intent)

    def _intent_by_key(self, workflow: str, key: str, writer: str | None) -> Record | None:
        found = None
        for record in self.broker.workflow_records(workflow, whole=True):
            body = None if record.event is None else record.event.body
            keyed = isinstance(body, ev.StepIntended) and body.idempotency_key == key
            if keyed and writer in (None, record.writer):
                found = record
        return found

    def _check_open(self, effect: sv.Effect, workflow: str, intent: Record) -> None:
        assert intent.event is not None and intent.event.step_id is not None
        state = self._fold(workflow)
        step = state.steps.get(intent.event.step_id)
        fenced = any(a.event_id == intent.event.event_id for a in state.anomalies)
        body = intent.event.body
        assert isinstance(body, ev.StepIntended)
        if fenced:
            why = "its intent was fenced off by a newer claim"
        elif step is None or step.attempt != body.attempt or step.status is not StepStatus.INTENDED:
            status = "gone" if step is None else f"{step.status.value} (attempt {step.attempt})"
            why = f"the log had decided the step: {status}"
        else:
            return
        self._add(
            "effect_under_open_intent",
            workflow,
            f"{effect.actor} made {effect.kind} of {effect.ref} but {why}",
        )

    def _check_undo(self, effect: sv.Effect, workflow: str) -> None:
        intent = self._intent_by_key(workflow, effect.key, None)
        if intent is None or intent.event is None:
            return
        step_id = intent.event.step_id
        state = WorkflowState(workflow)
        claims: dict[str, tuple[int, str | None]] = {}
        verdict = f"no compensation_intended the log took for {step_id}"
        for record in self.broker.workflow_records(workflow, whole=True):
            event = record.event
            if event is None or event.event_id in state.seen:
                continue
            ended = state.status.value != "running"
            refused = state.apply(event) is not None
            body = event.body
            if isinstance(body, ev.WorkflowStarted | ev.WorkflowResumed):
                claims[record.writer] = (body.attempt, body.runner)
            if event.step_id != step_id or not isinstance(body, ev.CompensationIntended):
                continue
            if refused and record.writer != effect.actor:
                continue  # another's claim the log refused: it authorises nothing
            # A claim the log took is the owner's decision, whoever carries it out later (a
            # resumed process, the daemon); one the log refused forbids its writer the undo.
            verdict = _claim_verdict(state, record, refused, ended, claims)
        if verdict:
            self._add(
                "compensation_by_owner", workflow, f"{effect.kind} of {effect.ref}: {verdict}"
            )

    def _check_approval(self, effect: sv.Effect, workflow: str, intent: Record) -> None:
        assert intent.event is not None
        step = intent.event.step_id or ""
        state = WorkflowState(workflow)
        requests: dict[int, str] = {}
        """Request number -> the event id of the request the fold took."""
        granted = None
        for record in self.broker.workflow_records(workflow, whole=True):
            event = record.event
            if event is None or event.event_id in state.seen:
                continue
            taken = state.apply(event) is None and event.step_id == step
            body = event.body
            if taken and isinstance(body, ev.ApprovalRequested):
                requests[body.request] = event.event_id
            elif taken and isinstance(body, ev.ApprovalDecided) and body.granted:
                granted = body.request
        if granted is None:
            self._add("approval_covers_call", workflow, f"{effect.ref} ran with no approval")
            return
        shown = self.shown.get(requests.get(granted, ""))
        if shown is not None and shown != effect.arguments:
            self._add(
                "approval_covers_call",
                workflow,
                f"{effect.ref} ran as {_call(effect.arguments)}, approved as {_call(shown)}",
            )

    # -- what actors hold ----------------------------------------------------------------

    def check_handle(self, workflow: str, seen: Iterable[str], what: str = "its handle") -> None:
        """``log_isolation``: what an actor holds of a workflow is of this log only."""
        foreign = [e for e in seen if e not in self.event_ids]
        if foreign:
            detail = f"{what} holds {len(foreign)} event(s) of no record of this log"
            self._add("log_isolation", workflow, detail)

    def check_history(self, workflow: str, events: list[ev.Event], reader: str) -> None:
        """``log_isolation``: a history read (a tail completed from a checkpoint)."""
        self.check_handle(workflow, (e.event_id for e in events), f"{reader}'s history read")

    def check_checkpoint(self, partition: int, record: MemRecord) -> None:
        """``log_isolation``: a checkpoint written for this log holds only its events."""
        if record.writer.split(".")[0] != "checkpointer":
            return  # the other deployment's writes are its own log's business
        held = checkpoint_events(record, self.broker.codec)
        if held is not None:
            what = f"{record.writer}'s checkpoint of p{partition}"
            self.check_handle(held[0], held[1], what)

    def check_projection(
        self, workflow: str, projected: WorkflowState, since: int, through: int
    ) -> None:
        """``projection_is_fold``: the projector's state against a fresh fold of what it read."""
        state = WorkflowState(workflow)
        for record in self.broker.workflow_records(workflow, whole=True):
            if since <= record.offset < through and record.event is not None:
                state.apply(record.event)
        if summary(state) != summary(projected):
            self._add(
                "projection_is_fold",
                workflow,
                f"projected {summary(projected)} but the log folds to {summary(state)}",
            )

    def _fold(self, workflow: str) -> WorkflowState:
        state = WorkflowState(workflow)
        for record in self.broker.workflow_records(workflow, whole=True):
            if record.event is not None:
                state.apply(record.event)
        return state

    def _add(self, invariant: str, workflow: str, detail: str) -> None:
        self.found.append(Violation(invariant, workflow, detail, self.broker.sched.now_ms))


def _decides(event: ev.Event) -> bool:
    """True for a decision on an intent made by someone other than its agent."""
    body = event.body
    if isinstance(body, ev.StepOutcome):
        if body.source is Source.AGENT:
            return False
        evidence = json.loads(body.evidence_json or "{}")
        return not (isinstance(evidence, dict) and evidence.get("before_due"))
    if isinstance(body, ev.CompensationIntended):
        return body.source is not Source.AGENT
    return isinstance(body, ev.StepAbandoned)


def _claim_verdict(
    state: WorkflowState,
    record: Record,
    anomaly: bool,
    ended: bool,
    claims: dict[str, tuple[int, str | None]],
) -> str:
    """Why a compensation claim gave its writer no right to compensate ('' if it did)."""
    if anomaly:
        return f"the log refused {record.writer}'s compensation_intended"
    if ended:
        return f"{record.writer} wrote compensation_intended after the workflow ended"
    own = claims.get(record.writer)
    if own is not None and (state.attempt, state.runner) != own:
        return (
            f"{record.writer} held attempt {own[0]}, the workflow was at attempt "
            f"{state.attempt} (runner {state.runner})"
        )
    return ""


def summary(state: WorkflowState) -> tuple[object, ...]:
    """What a projection must agree with the fold on."""
    steps = tuple(
        (s.step_id, s.status.value, s.attempt, s.idempotency_key, s.result_json)
        for s in state.ordered_steps()
    )
    anomalies = tuple(sorted(a.kind for a in state.anomalies))
    return (state.status.value, state.attempt, state.runner, steps, anomalies)


def _call(arguments: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(arguments.items()) if k != "ref")


def undecided(state: WorkflowState) -> list[str]:
    """Steps still in doubt (an intent or a compensation with no outcome)."""
    return [s.step_id for s in state.ordered_steps() if s.status in _ACTIONABLE]

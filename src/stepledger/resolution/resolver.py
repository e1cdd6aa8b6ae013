"""The one resolution code path: the recovery daemon and the SDK's resume both call it.

:class:`Resolver` runs one recovery attempt on an in-doubt step the way its tool declares
(query, re-drive, compensate, escalate), appends every decision durably through the
:class:`~stepledger.log.EventLog` (what was tried, what the tool answered), folds the
events into the workflow state and returns the step's new state.

Event ids are derived from the step, its attempt and the recovery attempt, so a resolver
that retries writes the same ids: duplicates the fold ignores. Two resolvers racing on the
same step (a resuming agent and the daemon, or two daemons across a rebalance) are ordered
by the log: a decision that runs a hook with an effect (a compensation) is first appended
as a claim under the resolver's own id (``compensation_intended``), then read back through
a :class:`~stepledger.resolution.claims.ClaimCheck` by
:func:`~stepledger.resolution.claims.read_back`, the check a runner makes before its own
calls; the hook runs only if the log's fold accepted the claim as the first decision on
the step's attempt. A losing resolver runs nothing and returns the step as the log has it.
A resolver settling for a runner (a resuming agent) names that runner and its claim in its
compensation claims: one written after a newer claim of the workflow is a
``zombie_compensation``, and the resolver raises WorkflowTakenOverError without calling
anything. Decisions without an effect (a query's answer, an escalation) are their own
claims: the first in the log stands and a later one is an anomaly. A hook runs on a daemon
thread bounded by the tool's timeout; a hook that hangs past it is counted as a failed
attempt, but its thread cannot be killed and runs on until the hook returns (keep hooks'
own I/O timeouts below the tool's).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Protocol

from stepledger import tracing
from stepledger.deadletters.events import EventLetterSink
from stepledger.domain import events as ev
from stepledger.domain import ids, oversize
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, ResolutionPolicy, Source
from stepledger.domain.factory import Clock, EventFactory, utc_now
from stepledger.domain.state import StepState, StepStatus, WorkflowState
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import (
    BrokerError,
    OwnershipLostError,
    RecordTooLargeError,
    RecoveryError,
    WorkflowTakenOverError,
)
from stepledger.kafka import Position
from stepledger.log import Acknowledgement, EventLog
from stepledger.resolution.claims import ClaimCheck, Standing, read_back, taken_over
from stepledger.resolution.hooks import (
    HookPool,
    checked_query,
    intent_arguments,
    known_result,
    shared_pool,
)
from stepledger.resolution.registry import ToolRegistry

logger = logging.getLogger(__name__)

LATE_VERDICT_KINDS = {
    rs.LateVerdict.SUPERSEDED: "late_outcome_superseded",
    rs.LateVerdict.EVIDENCE: "late_outcome_evidence",
    rs.LateVerdict.CONFLICT: "conflicting_late_outcome",
}


@dataclass(frozen=True)
class Resolution:
    """What one resolution attempt did: the action, the events appended and the new step."""

    step: StepState
    """The step's state after the appended events were folded in."""
    action: rs.Action
    """The decision that was carried out."""
    events: tuple[ev.Event, ...] = ()
    """Every event appended (each acknowledged by the log), in order."""
    positions: tuple[Position, ...] = ()
    """Where each appended event landed."""
    error: str | None = None
    """The hook's error when the attempt failed (the step stays in doubt)."""
    lost: bool = False
    """Another decision came first in the log: nothing was carried out, ``step`` is the log's."""


#: Waits for what an attempt sent and returns what it did (see :meth:`Resolver.begin`).
Settle = Callable[[], Resolution]


class ResolutionObserver(Protocol):
    """Told about every resolution that appended events (metrics, logs)."""

    def __call__(self, resolution: Resolution, tool: Tool | None) -> None:
        """Observe one resolution."""
        ...


@dataclass
class _Attempt:
    state: WorkflowState
    step: StepState
    tool: Tool | None
    action: rs.Action
    events: list[ev.Event] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    error: str | None = None
    lost: bool = False
    pending: list[Acknowledgement] = field(default_factory=list)
    """Events sent and not yet acknowledged (pipelined mode), in the order sent."""

    def settle(self) -> None:
        """Wait for every event sent: each one acknowledged, or the first refusal raised."""
        while self.pending:
            self.positions.append(self.pending.pop(0)())

    def result(self) -> Resolution:
        step = self.state.steps.get(self.step.step_id, self.step)
        return Resolution(
            step, self.action, tuple(self.events), tuple(self.positions), self.error, self.lost
        )


class _HookFailed(Exception):
    """The hook raised or timed out; its error is already recorded."""


class _ClaimLost(Exception):
    """Another decision came first in the log; ``run.state`` is the log's now."""


class Resolver:
    """Resolves in-doubt steps by their tool's policy, recording every decision as events."""

    def __init__(
        self,
        log: EventLog,
        events: EventFactory,
        tools: ToolRegistry,
        *,
        dead_letters: EventLetterSink | None = None,
        clock: Clock = utc_now,
        steady: Clock | None = None,
        grace: timedelta = timedelta(0),
        retry_base_s: float = 0.25,
        observer: ResolutionObserver | None = None,
        hooks: HookPool | None = None,
        confirm: ClaimCheck | None = None,
        claimant: str | None = None,
        pipeline: bool = False,
        record_limit: int | None = None,
        runner: str | None = None,
        epoch: int = 0,
    ) -> None:
        self.log = log
        self.events = events
        self.tools = tools
        self.dead_letters = dead_letters
        self.clock = clock
        """The wall clock of the timestamps this resolver writes."""
        self.steady = steady or clock
        """The clock a step's waits are measured on (its arrival's); by default ``clock``."""
        self.grace = grace
        self.retry_base_s = retry_base_s
        self.observer = observer
        self.hooks = hooks or shared_pool()
        self.confirm = confirm
        """How a claim is read back; None trusts the local fold (one resolver only)."""
        self.claimant = claimant or uuid.uuid4().hex[:16]
        """Part of this resolver's claim ids: two resolvers' claims are never duplicates."""
        self.pipeline = pipeline
        """Send a resolution's events back to back and wait for them together (see _record)."""
        self.record_limit = record_limit
        """Most bytes a recorded result (or the evidence beside it) may take; a larger one is
        kept as its digest.  None: nothing is cut (a log without a size limit)."""
        self.runner, self.epoch = runner, epoch
        """The runner (and its claim) this resolver settles for, or None (the recovery daemon,
        fenced by partition ownership): a runner's compensation claims name both, and one
        the log fenced off raises WorkflowTakenOverError (nothing is called)."""
        self._fleets: dict[str, EventFactory] = {}
        """The factory of each fleet whose workflows this resolver decided (see _factory)."""

    def decide(
        self, state: WorkflowState, step_id: str, arrival: rs.Arrival | None = None
    ) -> rs.Action:
        """The action a resolution of this step would take now (nothing is done).

        ``arrival`` says when the step's events reached this process, on ``steady``: the
        step's waits are then measured from there (one clock, see domain.resolution).
        """
        step = _step(state, step_id)
        tool = self.tools.get(step.tool)
        now = self.steady()
        return rs.decide(
            step,
            tool,
            now=now,
            grace=self.grace,
            retry_base_s=self.retry_base_s,
            arrival=arrival,
        )

    def resolve(self, state: WorkflowState, step_id: str) -> StepState:
        """Run one resolution attempt for an in-doubt step and return the step's new state.

        The attempt queries, re-drives, compensates or escalates per the step's tool, appends
        every decision event durably to the log and folds it into ``state``.  A step that is
        not due yet (deadline + grace) or needs nothing is returned unchanged.
        """
        return self.attempt(state, step_id).step

    def attempt(
        self, state: WorkflowState, step_id: str, arrival: rs.Arrival | None = None
    ) -> Resolution:
        """Like :meth:`resolve`, returning everything the attempt did."""
        return self.begin(state, step_id, arrival)()

    def begin(
        self, state: WorkflowState, step_id: str, arrival: rs.Arrival | None = None
    ) -> Settle:
        """Carry one attempt out up to its last append; the call returned waits for the rest.

        Everything an effect, a claim's read-back or a dead letter depends on is
        acknowledged before it, as in :meth:`attempt`; only the acknowledgements of the
        events sent last are left to the returned call, which waits for every event sent
        and returns what the attempt did (or raises the first refusal).  A caller may begin
        other attempts meanwhile: the recovery daemon's workers go on to the next step
        while one thread waits for the acknowledgements in order.
        """
        action = self.decide(state, step_id, arrival)
        step = _step(state, step_id)
        run = _Attempt(state, step, self.tools.get(step.tool), action)
        if action.kind not in (rs.ActionKind.NONE, rs.ActionKind.WAIT):
            # A failed hook is already recorded as an attempt; the step stays in doubt.
            # A lost claim leaves the decision to whoever came first in the log.
            with (
                contextlib.suppress(_HookFailed, _ClaimLost),
                tracing.decision_span(state.workflow_id, step_id, action.kind.value),
            ):
                self._carry_out_counted(run)
        return functools.partial(self._settled, run)

    def _settled(self, run: _Attempt) -> Resolution:
        try:
            run.settle()
        except RecordTooLargeError as exc:
            self._too_large(run, exc)
            run.settle()
        resolution = run.result()
        if self.observer is not None and run.events:
            self.observer(resolution, run.tool)
        return resolution

    def settle_if_found(
        self, state: WorkflowState, step_id: str, arrival: rs.Arrival | None = None
    ) -> Resolution:
        """Query an in-doubt step before it is due; record a decision only if it is found.

        See :func:`stepledger.domain.resolution.query_before_due`: a found effect is recorded
        as the query's outcome (``succeeded``) at once; "not found", a failing hook or a
        step that does not qualify records nothing and returns the step unchanged (the
        ordinary resolution after the deadline decides it).  The hook is bounded by the
        tool's timeout and by the time left until the step is due.
        """
        step = _step(state, step_id)
        tool = self.tools.get(step.tool)
        now = self.steady()
        action = rs.query_before_due(
            step, tool, now=now, grace=self.grace, retry_base_s=self.retry_base_s, arrival=arrival
        )
        if action is None or tool is None or tool.query is None or action.due_at is None:
            return Resolution(step, rs.Action(rs.ActionKind.NONE))
        bound = min(tool.timeout_s, (action.due_at - now).total_seconds())
        run = _Attempt(state, step, tool, action)
        try:
            query, args = checked_query(tool.query), (_args(run), step.idempotency_key)
            answer = self.hooks.call(query, args, bound, f"{tool.name}.query")
        except Exception as exc:
            logger.info(
                "query before the deadline failed; waiting for the deadline",
                extra={**_where(run), "error": f"{type(exc).__name__}: {exc}"[:500]},
            )
            return run.result()
        if not isinstance(answer, Found):
            return run.result()
        # The same decision span as a due resolution: settling by a found effect is a decision.
        with tracing.decision_span(state.workflow_id, step_id, action.kind.value):
            self._tried(run, ResolutionPolicy.QUERY, answer)
            self._answered(run, answer, before_due=True)
        resolution = run.result()
        if self.observer is not None:
            self.observer(resolution, tool)
        return resolution

    def judge_late(self, state: WorkflowState, outcome: ev.Event) -> Resolution:
        """Record how an outcome that arrived after the step was decided is handled.

        Appends ``AnomalyObserved`` (kind ``late_outcome_superseded``, ``late_outcome_evidence``
        or ``conflicting_late_outcome``); a conflict also opens an escalation on the step,
        whose status stands until a human's verdict re-judges it.
        """
        body = outcome.body
        if not isinstance(body, ev.StepOutcome) or outcome.step_id is None:
            raise RecoveryError("judge_late needs a step outcome", workflow_id=outcome.workflow_id)
        step = _step(state, outcome.step_id)
        verdict = rs.judge_late_outcome(step, body)
        run = _Attempt(state, step, self.tools.get(step.tool), rs.Action(rs.ActionKind.NONE))
        detail = late_detail(step, outcome, body, verdict)
        anomaly = ev.AnomalyObserved(
            kind=LATE_VERDICT_KINDS[verdict],
            detail=ids.canonical_json(detail),
            source=Source.RECOVERY,
        )
        self._append(run, anomaly, outcome.event_id)
        if verdict is rs.LateVerdict.CONFLICT:
            kind = rs.EscalationKind.CONFLICT.value
            escalation = ids.escalation_id(state.workflow_id, step.step_id, kind, body.attempt)
            reason = (
                f"conflicting_late_outcome: the agent says {body.status.value} for attempt "
                f"{body.attempt} after the step was decided {step.status.value}"
            )
            self._abandon(run, reason, escalation, detail)
        run.settle()
        return run.result()

    # -- carrying out one action -------------------------------------------------------

    def _carry_out_counted(self, run: _Attempt) -> None:
        """Carry the action out; whatever raises (but the log) counts as a failed attempt.

        A poison intent (arguments that are not JSON, a hook that cannot be called with
        them) fails the same way on every attempt: counting each one is what ends it in an
        abandonment, an escalation and a dead letter at the tool's ``max_attempts``.  A log
        that refuses appends is not the step's fault and is not counted (it could not be
        recorded anyway): the caller retries later.
        """
        try:
            self._carry_out(run)
        except RecordTooLargeError as exc:
            self._too_large(run, exc)
        except (_HookFailed, _ClaimLost, BrokerError, OwnershipLostError, WorkflowTakenOverError):
            raise
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:2000]
            logger.warning("resolution failed", extra={**_where(run), "error": run.error})
            policy = _POLICY_OF.get(run.action.kind, ResolutionPolicy.ESCALATE)
            failed = ev.ResolutionAttempted(
                policy=policy, attempt=max(1, run.action.attempt), error=run.error
            )
            qualifiers = (run.step.attempt, run.action.attempt, policy.value, "failed")
            self._append(run, failed, *qualifiers)

    def _too_large(self, run: _Attempt, exc: RecordTooLargeError) -> None:
        """Count a decision the log refused as too large: the next attempt, or a person.

        The broker takes smaller records than this resolver fitted to (the topic's limit
        could not be read): sending the same decision again fails the same way, so the
        attempt is recorded as failed, and past the tool's ``max_attempts`` the step is
        escalated (a re-drive's effect is keyed, so the attempts repeat nothing).
        """
        for pending in run.pending:
            # Sent after the refused record: landed or not, the log read back tells.
            with contextlib.suppress(BrokerError):
                run.positions.append(pending())
        run.pending.clear()
        run.error = f"the decision could not be recorded: {exc}"[:2000]
        logger.warning("decision too large to record", extra={**_where(run), "error": run.error})
        policy = _POLICY_OF.get(run.action.kind, ResolutionPolicy.ESCALATE)
        failed = ev.ResolutionAttempted(
            policy=policy, attempt=max(1, run.action.attempt), error=run.error
        )
        qualifiers = (run.step.attempt, run.action.attempt, policy.value, "too_large")
        self._append(run, failed, *qualifiers)

    def _carry_out(self, run: _Attempt) -> None:
        kind, tool = run.action.kind, run.tool
        if kind is rs.ActionKind.GIVE_UP:
            self._give_up(run)
        elif tool is None:
            raise RecoveryError(f"no tool {run.step.tool!r} to {kind.value}", tool=run.step.tool)
        elif kind is rs.ActionKind.QUERY:
            self._query(run, tool)
        elif kind is rs.ActionKind.REDRIVE:
            self._redrive(run, tool)
        elif kind is rs.ActionKind.COMPENSATE:
            self._compensate(run, tool)
        elif kind is rs.ActionKind.ESCALATE:
            self._escalate(run, tool)

    def _query(self, run: _Attempt, tool: Tool) -> None:
        assert tool.query is not None
        step = run.step
        query = checked_query(tool.query)
        answer = self._hook(run, ResolutionPolicy.QUERY, query, _args(run), step.idempotency_key)
        if isinstance(answer, NotFound) and rs.redrive_after_not_found(tool):
            self._redrive(run, tool)
            return
        self._answered(run, answer)

    def _answered(self, run: _Attempt, answer: Found | NotFound, before_due: bool = False) -> None:
        """Record what a query answered as the step's outcome, with the answer as evidence."""
        evidence = {"policy": "query", "attempt": run.action.attempt, **rs.answer_evidence(answer)}
        if before_due:
            evidence["before_due"] = True
        result = answer.result if isinstance(answer, Found) else None
        self._outcome(run, rs.query_status(answer), Source.RECOVERY_QUERY, result, evidence)

    def _redrive(self, run: _Attempt, tool: Tool) -> None:
        hook = tool.redrive_hook
        assert hook is not None
        result = self._hook(
            run, ResolutionPolicy.REDRIVE, hook, _args(run), run.step.idempotency_key
        )
        evidence = {"policy": "redrive", "attempt": run.action.attempt, "result": result}
        self._outcome(run, OutcomeStatus.SUCCEEDED, Source.RECOVERY_REDRIVE, result, evidence)

    def _compensate(self, run: _Attempt, tool: Tool) -> None:
        assert tool.compensate is not None
        step = run.step
        if step.status is StepStatus.INTENDED:
            intended = ev.CompensationIntended(
                idempotency_key=ids.compensation_key(step.idempotency_key),
                reason=_held("intent without outcome past its deadline", run),
                source=Source.RECOVERY_COMPENSATE,
                deadline=self.clock() + timedelta(seconds=tool.timeout_s),
                attempt=step.attempt,
                epoch=self.epoch,
                runner=self.runner,
            )
            claim = self._append(run, intended, step.attempt, "recovery", self.claimant)
            self._ensure_claim(run, claim)
        # The hook gets the step's own key: it names the effect to undo.  The compensation's
        # own key (recorded above) is ids.compensation_key of it, for services that want one.
        args = (_args(run), step.idempotency_key, known_result(step))
        answer = self._hook(run, ResolutionPolicy.COMPENSATE, tool.compensate, *args)
        result = None if isinstance(answer, NotFound) else answer
        done = ev.CompensationOutcome(
            status=rs.compensation_status(answer),
            result_json=None if result is None else ids.canonical_json(result),
            source=Source.RECOVERY_COMPENSATE,
        )
        self._append(run, done, step.attempt, "recovery")

    def _escalate(self, run: _Attempt, tool: Tool) -> None:
        evidence: dict[str, Any] = {"policy": "escalate", "tool": tool.name}
        if run.action.probe and tool.query is not None:
            query = checked_query(tool.query)
            try:
                probe = self._hook(
                    run, ResolutionPolicy.ESCALATE, query, _args(run), run.step.idempotency_key
                )
                evidence["probe"] = rs.answer_evidence(probe)
            except _HookFailed:
                evidence["probe_error"] = run.error
        self._abandon(run, run.action.reason, self._escalation_id(run), evidence)

    def _give_up(self, run: _Attempt) -> None:
        reason = run.action.reason
        evidence = {"recovery_attempts": run.step.recovery_attempts, "reason": reason}
        abandonment = self._abandon(run, reason, self._escalation_id(run), evidence)
        run.settle()
        if run.action.dead_letter and self.dead_letters is not None:
            self.dead_letters.publish(abandonment, reason=reason)

    def _ensure_claim(self, run: _Attempt, claim: ev.Event) -> None:
        """Go on only if the log took the claim as the step's first decision (read_back).

        Without ``confirm`` (one resolver only) the local fold judges it.  A runner's claim
        the log fenced off raises WorkflowTakenOverError: the runner lost its workflow.
        """
        run.settle()
        local = run.state
        back = read_back(self.confirm or (lambda c, p: local), claim, run.positions[-1])
        if back.standing is Standing.STANDS:
            return
        if back.state is not None:
            run.state = back.state
        if back.standing is Standing.FENCED and back.state is not None:
            why = f"the log recorded its compensation of the step as {back.anomaly}"
            raise taken_over(back.state, run.step.step_id, self.epoch, why)
        run.lost = True
        logger.info(
            "claim lost: another decision came first in the log",
            extra={**_where(run), "claim": claim.event_id, "known": back.state is not None},
        )
        raise _ClaimLost(claim.event_id)

    # -- recording ---------------------------------------------------------------------

    def _hook(
        self, run: _Attempt, policy: ResolutionPolicy, hook: Callable[..., Any], *args: Any
    ) -> Any:
        """Run a hook bounded by the tool's timeout and record the attempt either way."""
        assert run.tool is not None
        run.settle()  # what was recorded before the hook is durable before its effect
        name = f"{run.tool.name}.{policy.value}"
        try:
            answer = self.hooks.call(hook, args, run.tool.timeout_s, name)
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:2000]
            logger.warning(
                "recovery hook failed", extra={**_where(run), "hook": name, "error": run.error}
            )
            failed = ev.ResolutionAttempted(
                policy=policy, attempt=run.action.attempt, error=run.error
            )
            self._append(run, failed, run.step.attempt, run.action.attempt, policy.value)
            raise _HookFailed(run.error) from exc
        self._tried(run, policy, answer)
        return answer

    def _tried(self, run: _Attempt, policy: ResolutionPolicy, answer: Any) -> None:
        """Record a hook's answer as a resolution attempt."""
        answer_json = ids.canonical_json(_evidence(rs.answer_evidence(answer)))
        tried = ev.ResolutionAttempted(
            policy=policy, attempt=run.action.attempt, answer_json=answer_json
        )
        self._append(run, tried, run.step.attempt, run.action.attempt, policy.value)

    def _outcome(
        self, run: _Attempt, status: OutcomeStatus, source: Source, result: Any, evidence: Any
    ) -> None:
        encoded = run.tool.results.encode(result) if run.tool is not None else None
        if encoded is not None and self.record_limit is not None:
            encoded = oversize.fitted(encoded, self.record_limit)
        event = self._factory(run.state).outcome(
            run.state.workflow_id,
            run.step.step_id,
            attempt=run.step.attempt,
            status=status,
            source=source,
            result=result if encoded is None else encoded.value,
            result_type=None if encoded is None else encoded.result_type,
            evidence=_evidence(_with_hold(evidence, run)),
            # One id per decided attempt, whichever path (query or re-drive) decided it:
            # two resolvers answering the same step write one event, never two competing.
            qualifiers=(run.step.attempt, "recovery"),
        )
        self._record(run, event)

    def _abandon(self, run: _Attempt, reason: str, escalation: str, evidence: Any) -> ev.Event:
        body = ev.StepAbandoned(
            reason=reason,
            escalation_id=escalation,
            evidence_json=ids.canonical_json(_evidence(_with_hold(evidence, run))),
            source=Source.RECOVERY,
        )
        return self._append(run, body, escalation)

    def _append(self, run: _Attempt, body: ev.Body, *qualifiers: object) -> ev.Event:
        factory = self._factory(run.state)
        event = factory.envelope(run.state.workflow_id, run.step.step_id, body, *qualifiers)
        self._record(run, event)
        return event

    def _record(self, run: _Attempt, event: ev.Event) -> None:
        # Durable first, folded second: the state never runs ahead of the log.  Pipelined,
        # the events of one resolution are sent back to back (one workflow: one partition,
        # kept in order by the idempotent producer) and the resolution is settled, every
        # event acknowledged, before any hook runs, a claim is read back, a dead letter is
        # published or the resolution is returned: no effect and no reader runs ahead of
        # the log, and a refused event fails the whole resolution as a refused append did.
        if self.pipeline:
            run.pending.append(self.log.send(event))
        else:
            run.positions.append(self.log.append(event))
        run.events.append(event)
        run.state.apply(event)

    def _factory(self, state: WorkflowState) -> EventFactory:
        # Decisions carry the workflow's own fleet, whatever fleet the resolver runs for.
        fleet = state.fleet_id
        if not fleet or fleet == self.events.fleet_id:
            return self.events
        factory = self._fleets.get(fleet)
        if factory is None:
            if len(self._fleets) >= _FLEETS_KEPT:
                self._fleets.clear()
            factory = self._fleets[fleet] = replace(self.events, fleet_id=fleet)
        return factory

    @staticmethod
    def _escalation_id(run: _Attempt) -> str:
        kind = (run.action.escalation or rs.EscalationKind.POLICY).value
        return ids.escalation_id(run.state.workflow_id, run.step.step_id, kind, run.step.attempt)


#: Fleets whose event factories a resolver keeps (a daemon serves a handful of fleets).
_FLEETS_KEPT = 256

_POLICY_OF = {
    rs.ActionKind.QUERY: ResolutionPolicy.QUERY,
    rs.ActionKind.REDRIVE: ResolutionPolicy.REDRIVE,
    rs.ActionKind.COMPENSATE: ResolutionPolicy.COMPENSATE,
}


def late_detail(
    step: StepState, outcome: ev.Event, body: ev.StepOutcome, verdict: rs.LateVerdict
) -> dict[str, Any]:
    """The evidence recorded about a late outcome: what it says and what decision stands."""
    return {
        "verdict": verdict.value,
        "late_event_id": outcome.event_id,
        "late_status": body.status.value,
        "late_attempt": body.attempt,
        "late_source": body.source.value,
        "standing_status": step.status.value,
        "standing_attempt": step.attempt,
        "standing_by": None if step.resolved_by is None else step.resolved_by.value,
    }


def _step(state: WorkflowState, step_id: str) -> StepState:
    step = state.steps.get(step_id)
    if step is None:
        raise RecoveryError(
            f"workflow {state.workflow_id!r} has no step {step_id!r}",
            workflow_id=state.workflow_id,
            step_id=step_id,
        )
    return step


def _evidence(value: Any) -> Any:
    """Evidence as recorded (what a hook answered, why): for a person to read, so each large
    part (a result, a probe's answer) is kept as its digest and a decision fits a record
    whatever the topic's limit; the result itself is the outcome's, fitted to the limit."""
    if isinstance(value, dict):
        return {k: oversize.fitted_value(v, oversize.EVIDENCE_KEPT) for k, v in value.items()}
    return oversize.fitted_value(value, oversize.EVIDENCE_KEPT)


def _hold_of(run: _Attempt) -> str | None:
    """The operator's hold of recovery the step waited through (its intent came before the
    hold was lifted), in words: the decision taken at the unpause names it."""
    state, intended = run.state, run.step.intended_at
    lifted = state.hold_lifted_at
    if lifted is None or intended is None or intended > lifted:
        return None
    return state.recovery_hold


def _held(reason: str, run: _Attempt) -> str:
    hold = _hold_of(run)
    return reason if hold is None else f"{reason} (recovery was held: {hold})"


def _with_hold(evidence: Any, run: _Attempt) -> Any:
    hold = _hold_of(run)
    if hold is None or not isinstance(evidence, dict):
        return evidence
    return {**evidence, "recovery_hold": hold}


def _args(run: _Attempt) -> dict[str, Any]:
    return intent_arguments(run.step)


def _where(run: _Attempt) -> dict[str, Any]:
    return {"workflow_id": run.state.workflow_id, "step_id": run.step.step_id}

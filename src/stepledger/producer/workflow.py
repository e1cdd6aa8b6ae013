"""A workflow's handle: steps bracketed durably, replayed from the log when it is resumed.

A step call is matched against the log by its step id (:mod:`stepledger.domain.replay`):
a recorded outcome is returned without calling the tool, a step in doubt is settled
first (:mod:`stepledger.producer.settling`), an approval gate waits for its decision, and
the saga rules (:mod:`stepledger.domain.saga`) are checked before a new intent.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stepledger import tracing
from stepledger.domain import events as ev
from stepledger.domain import oversize
from stepledger.domain.context import ContextHook, StepSummary, build_context
from stepledger.domain.enums import OutcomeStatus, WorkflowStatus
from stepledger.domain.replay import Move, MoveKind, mismatch, mismatch_versions, next_move
from stepledger.domain.resolution import Arrival, step_arrivals
from stepledger.domain.saga import (
    PlanRules,
    PlanStep,
    Violation,
    ensure_plan,
    step_violations,
)
from stepledger.domain.state import (
    ENDED,
    RunStatus,
    StepState,
    StepStatus,
    WorkflowState,
    replay,
)
from stepledger.domain.tools import Tool
from stepledger.errors import (
    ApprovalPendingError,
    LedgerStateError,
    PlanMismatchError,
    RecordTooLargeError,
    effect_unknown,
)
from stepledger.kafka import Position
from stepledger.producer import (
    approval,
    compensation,
    escalation,
    fence,
    pipelining,
    settling,
    steering,
    stepcall,
)
from stepledger.producer._refusals import ensure_nothing_open, refusal
from stepledger.producer.positions import RunOrder
from stepledger.terminal import shell_arg

if TYPE_CHECKING:
    from stepledger.producer.session import Session

ToolFn = Callable[[dict[str, Any], str], Any]
_MAX_ROUNDS = 8
#: Keep the fold of what an open read when the handle's first record is a claim, so the
#: claim's read back folds only what follows it (the replay of a long workflow earns it:
#: docs/benchmarks.md, "Fast paths and their A/B"); False folds every read back afresh,
#: the path it must agree with. The tests run both.
KEEP_READ_FOLD = True


class Workflow:
    """One workflow's handle: records its steps and keeps its state as the log tells it."""

    def __init__(
        self,
        ledger: Session,
        workflow_id: str,
        events: Iterable[ev.Event] = (),
        appended: Mapping[str, datetime] | None = None,
    ) -> None:
        self.ledger = ledger
        self.workflow_id = workflow_id
        read = list(events)
        self.state: WorkflowState = replay(workflow_id, read)
        self.arrivals: dict[str, tuple[StepState, Arrival]] = {}
        """Each step as the last read folded it, and when its events were appended on this
        process's clock (``History.appended``: the broker's time); settling goes by it while
        the step is still as read."""
        self._read: list[str] | None = [event.event_id for event in read]
        """The ids of the events read at open, in order, while the state is their fold."""
        self._base: tuple[list[str], WorkflowState] | None = None
        """Those ids and their fold, kept apart when this handle's first event is a claim
        (``workflow_resumed``): its read back begins with them and folds only what follows."""
        self.position: Position | None = None
        """Where this handle's last appended event landed."""
        self.appended = 0
        """How many events this handle appended."""
        self._lock = threading.RLock()
        self._arrived(read, appended or {})
        self._order = RunOrder()
        """The positions of this run's step calls."""
        self._tools: dict[str, Tool] = {}
        self._recorded_until = _last_position(self.state)
        self.runner = fence.new_runner()
        """This handle's runner identity: every claim, intent and outcome it writes names it."""
        self.epoch = 0
        """The attempt this handle claimed (0 until it claims one): its intents carry it."""
        self.after_intent: Callable[[str], None] | None = None
        """Called once a step's intent is acknowledged, before the call's checks (chaos, tests)."""
        self._outcomes = pipelining.OutcomeLog(ledger, workflow_id, self._lock, self._landed)
        """Where this handle appends: the log, holding a pipelined outcome back."""
        self._synced: Position | None = None
        """Set while the state is exactly the log's fold of the workflow through this record:
        a read back of a claim ended there, and every record folded since is this handle's
        own and landed right after the one before (see :meth:`read_claim`)."""

    @property
    def attempt(self) -> int:
        """The run of the workflow this handle is (1 for the first, +1 per resume)."""
        return self.state.attempt

    @property
    def finished(self) -> bool:
        """True once the workflow ended (completed, failed, compensated)."""
        return self.state.status in ENDED

    @property
    def lock(self) -> threading.RLock:
        """Held while the state is read or folded from several threads (helpers take it too)."""
        return self._lock

    @property
    def _pending(self) -> pipelining.HeldOutcome | None:
        """A step's outcome sent and folded but not yet acknowledged (pipelined outcomes)."""
        return self._outcomes.pending

    def record(self, event: ev.Event) -> Position:
        """Append an event durably, then fold it into the local state.

        A pipelined outcome still unacknowledged is waited for together with this event
        (sent after it, so it lands before it): this returns once both are acknowledged.
        """
        position = self._outcomes.append(event)
        self._folded(event, position)
        tracing.recorded(event, position)
        return position

    async def arecord(self, event: ev.Event) -> Position:
        """Append an event durably (asyncio), then fold it into the local state."""
        position = await self._outcomes.append_async(event)
        self._folded(event, position)
        tracing.recorded(event, position)
        return position

    def _record_outcome(self, event: ev.Event) -> stepcall.StepProtocol:
        """Record a step's outcome: durably, or (pipelined outcomes) sent and folded now,
        the outcome before it settled (that wait blocks: off an event loop)."""
        if not self.ledger.options.pipeline_outcomes:
            yield stepcall.Record(event)
            return
        previous = self._outcomes.hold(event)
        with self._lock:  # folded now; its position comes with the acknowledgement
            self._fold(event)
            self.appended += 1
        tracing.sent(event)
        if previous is not None:
            yield stepcall.Blocking(self._outcomes.settle_one, (previous,))

    def settle_pending(self) -> None:
        """Wait until a pipelined outcome is acknowledged (at once when there is none).

        Raises DurabilityError if it was not: the step stays in doubt in the log, to be
        resolved by its policy, and this handle refuses further use.
        """
        self._outcomes.settle()

    async def asettle_pending(self) -> None:
        """Await a pipelined outcome's acknowledgement (asyncio; blocks no event loop)."""
        await self._outcomes.asettle()

    def _landed(self, position: Position) -> None:
        """A pipelined outcome was acknowledged at ``position`` (the lock is held)."""
        self.position = position
        self._synced = fence.next_synced(self._synced, position)

    def _ensure_usable(self) -> None:
        self._outcomes.ensure_usable()

    def adopt(self, events: Iterable[ev.Event]) -> None:
        """Fold events someone else appended (a resolver, a human) into the local state."""
        with self._lock:
            self._read = None  # the state is no longer the fold of what was read
            self._synced = None
            for event in events:
                self.state.apply(event)

    def reload(self, through: Position | None = None) -> None:
        """Read the workflow again and fold it afresh: the log's first decisions win.

        ``through``: where one of this handle's own records landed (a claim); the read may
        end there (everything acknowledged before it is below it) when the history can.
        """
        self.settle_pending()
        history = self.ledger.history.read(self.workflow_id, through=through)
        self._refold(history.events)
        self._arrived(history.events, history.appended)

    def _arrived(self, events: list[ev.Event], appended: Mapping[str, datetime]) -> None:
        """Note when the steps' events of a read (the state's fold now) were appended."""
        with self._lock:
            steps = self.state.steps
            refused = {anomaly.event_id for anomaly in self.state.anomalies}
            arrivals = step_arrivals(events, appended, refused)
            self.arrivals = {s: (steps[s], a) for s, a in arrivals.items() if s in steps}

    def _refold(self, events: list[ev.Event]) -> None:
        """Replace the state with the fold of the events read back.

        The fold is a left fold in log order: when the read begins with the events this
        handle read at open (the same ids in the same order, as a claim's read back does),
        their fold is kept and only what follows them is folded onto it.
        """
        with self._lock:
            base, self._base, self._read, self._synced = self._base, None, None, None
            folded = 0
            if base is not None and _begins_with(events, base[0]):
                state, folded = base[1], len(base[0])
            else:
                state = WorkflowState(self.workflow_id)
            for event in events[folded:]:
                state.apply(event)
            self.state = state
            self._recorded_until = max(self._recorded_until, _last_position(self.state))

    def tool(self, name: str) -> Tool:
        """A tool this workflow used, or one of the ledger's registry."""
        return self._tools.get(name) or self.ledger.tools.require(name)

    def known_tool(self, name: str) -> Tool | None:
        """A tool this workflow used or the ledger knows, or None."""
        return self._tools.get(name) or self.ledger.tools.get(name)

    @tracing.traced_step
    def step(
        self,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any] | None = None,
        fn: ToolFn | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run one tool call bracketed by a durable intent and a durable outcome.

        The call's arguments are ``arguments`` and/or keywords (``wf.step("charge", charge,
        amount=1250)``); an argument named ``arguments`` or ``fn`` goes in the mapping.

        ``fn(arguments, idempotency_key)`` (or ``tool.run``) is called only after the intent
        is acknowledged; if that fails, a DurabilityError is raised and nothing is called.
        A raised error is recorded as a failed outcome and re-raised.  A step the log
        already settled returns its recorded result (or raises its recorded failure as a
        ToolCallError) without calling the tool.  With ``ResumeOptions(pipeline_outcomes=
        True)`` the outcome is acknowledged with the workflow's next event instead of before
        this returns (docs/guarantees.md, "Pipelined outcomes").
        """
        args = {**(arguments or {}), **kwargs}
        return stepcall.drive(self, self._protocol(step_id, tool, args, fn, on_loop=False))

    @tracing.traced_step
    async def astep(
        self,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any] | None = None,
        fn: Callable[[dict[str, Any], str], Any | Awaitable[Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`step` for asyncio; ``fn`` may be sync or async.  The same protocol: only
        what blocks (the call, a read back, settling, an approval's wait) leaves the loop."""
        args = {**(arguments or {}), **kwargs}
        return await stepcall.adrive(self, self._protocol(step_id, tool, args, fn, on_loop=True))

    def _protocol(
        self,
        step_id: str,
        tool: Tool,
        args: dict[str, Any],
        fn: Callable[..., Any] | None,
        *,
        on_loop: bool,
    ) -> stepcall.StepProtocol:
        """One step call, written once (see :mod:`stepcall`): yields the I/O it needs."""
        self._ensure_usable()
        if steering.holds(self.state, step_id):  # a pause this handle knows: nothing recorded
            yield from steering.hold(self, step_id)
        if step_id in self.state.steps:
            # Settling or waiting for an approval reads the log: it must hold ours first.
            yield stepcall.Settle()
            move = yield stepcall.Blocking(self._prepare, (step_id, tool, args))
        elif tool.requires_approval:
            # Asking waits for a person (approval_wait_s): never on the event loop.
            move = yield stepcall.Blocking(self._prepare, (step_id, tool, args))
        else:
            move = self._prepare(step_id, tool, args)
        if move.kind is MoveKind.REPLAY:
            return stepcall.recorded_result(tool, move.step)
        run = stepcall.runner(tool, fn, on_loop=on_loop)
        call = stepcall.call_for(self, step_id, tool, args, move)
        tracing.call_attempt(call.attempt, call.key)
        if call.event is not None:
            position = yield stepcall.Record(call.event)
            through = self._checked_now(call, tool, position)
            if through is False:
                # A hook or a read back blocks.  Otherwise the checks were made here: a
                # thread hop per step cost an event loop more than the step's fold.
                through = yield stepcall.Blocking(self._before_call, (call, tool, position))
            if isinstance(through, WorkflowState) and steering.holds(through, step_id):
                # Paused before the intent in the log's order: nothing is called.
                yield stepcall.Record(steering.not_called(self, call))
                yield stepcall.Blocking(self.reload, ())
                yield from steering.hold(self, step_id)
                return (yield from self._protocol(step_id, tool, args, fn, on_loop=on_loop))
        fence.ensure_in_time(call.budget, self.workflow_id, step_id, tool)
        try:
            result = yield stepcall.Call(run, call.arguments, call.key)
        except Exception as exc:
            if effect_unknown(exc) and tool.effectful:
                raise stepcall.left_in_doubt(self.workflow_id, call, tool, exc) from exc
            yield stepcall.Record(stepcall.outcome(self, call, OutcomeStatus.FAILED, error=exc))
            escalated = escalation.stranded_failure(self, step_id)
            if escalated is not None:
                yield stepcall.Record(escalated)
                escalation.note(self, step_id, exc)
            raise
        encoded = oversize.fitted(tool.results.encode(result), call.record_limit)
        outcome = stepcall.outcome(self, call, OutcomeStatus.SUCCEEDED, result=encoded)
        try:
            yield from self._record_outcome(outcome)
        except RecordTooLargeError:
            if not oversize.can_cut(encoded):
                raise
            encoded, outcome = stepcall.digest_outcome(self, call, encoded)
            yield from self._record_outcome(outcome)
        if call.past_deadline():
            # One rule, sync or async: recovery may have decided the step meanwhile.
            yield stepcall.Settle()
            yield stepcall.Blocking(stepcall.ensure_outcome_stands, (self, call))
        stepcall.ensure_replayable(tool, step_id, encoded)
        return result

    def read_claim(self, claim: ev.Event, position: Position) -> WorkflowState | None:
        """The log's fold of the workflow through one of this handle's claims, at ``position``.

        The fold decides a claim from what lies before it.  When the claim is the record this
        handle folded last and the state is the log's fold through the record before it
        (nothing else of any key landed between them: consecutive offsets), the state is
        that fold and nothing is read.  Otherwise the workflow is read back through the
        claim; a read that ends at the claim and holds exactly the events folded here
        becomes the state, and the next claims are proven by their offsets again.
        """
        proven = self._proven(position)
        if proven is not None:
            return proven
        events = fence.read_claimed(self.ledger.history, claim, position)
        return self._logged(claim, position, events)

    def _logged(self, claim: ev.Event, position: Position, events: list[ev.Event]) -> WorkflowState:
        """The fold of a read back through a claim; it becomes the state when it holds exactly
        the events folded here and ends at the claim (proven by offsets from there on).

        The fold stops at the claim: what landed after it (a pause after an intent: the
        step is in flight) is not what the claim was decided on."""
        cut = _through(events, claim.event_id)
        logged = replay(self.workflow_id, cut)
        with self._lock:
            ends_here = bool(events) and len(cut) == len(events)
            if ends_here and self._pending is None and logged.seen == self.state.seen:
                self.state, self._read, self._base = logged, None, None
                self._synced = position
        return logged

    def _proven(self, position: Position) -> WorkflowState | None:
        """The state, when it is the log's fold through the claim at ``position`` (no I/O)."""
        with self._lock:
            if self._synced == position and self._pending is None:
                return self.state
            return None

    def _checked_now(
        self, call: stepcall.PendingCall, tool: Tool, position: Position
    ) -> WorkflowState | bool:
        """Make the checks before the call here when they need no I/O; False: they remain.

        Returns the log's fold through the intent when the fence read it (a pause before the
        intent stops the call: :mod:`steering`), True when no fold was needed.
        """
        if self.after_intent is not None:
            return False
        if call.event is None or not fence.needs_read_back(tool):
            return True
        proven = self._proven(position)
        if proven is None:
            return False
        return fence.ensure_owner(lambda claim, at: proven, call.event, self.epoch, position)

    def _before_call(
        self, call: stepcall.PendingCall, tool: Tool, position: Position
    ) -> WorkflowState | None:
        """Between the intent's acknowledgement (at ``position``) and the call: only the
        owner calls (every effectful call, keyed or not: see :mod:`fence`); returns the
        log's fold through the intent when it was read."""
        if self.after_intent is not None:
            self.after_intent(call.step_id)
        if call.event is not None and fence.needs_read_back(tool):
            return fence.ensure_owner(self.read_claim, call.event, self.epoch, position)
        return None

    def fast_forward(self) -> None:
        """Take the recorded steps as this run's prefix: new steps follow them, none re-issued.

        For agents whose next steps come from a model that was shown the log: recorded steps
        keep their positions and are matched by step id whenever they are asked for again,
        and a new step takes the position after the last recorded one.
        """
        with self._lock:
            self._order.fast_forward(self.state, self._recorded_until)

    def plan(
        self, steps: Sequence[PlanStep | tuple[str, Tool]], rules: PlanRules | None = None
    ) -> tuple[Violation, ...]:
        """Check a runtime-generated plan: raise SagaViolationError naming every violation,
        else return its warnings (steps after the pivot that a person decides if they fail)."""
        rules = rules or PlanRules(read_only=self.state.read_only)
        return ensure_plan([plan_step(s) for s in steps], rules, workflow_id=self.workflow_id)

    def context(self, hook: ContextHook | None = None) -> list[StepSummary]:
        """The agent's working context rebuilt from the log (the conversation is not stored)."""
        with self._lock:
            return build_context(self.state, hook)

    def compensate(self, reason: str = "workflow compensated", *, finish: bool = True) -> list[str]:
        """Undo every effect that happened and can be undone, newest first.

        Each undo is its own intent/outcome.  Raises StepInDoubtError (nothing undone) while
        an effectful step's outcome is unknown.  Returns the compensated step ids.  With
        ``finish`` the workflow then ends ``compensated`` if nothing that happened is left
        standing, otherwise ``compensation_incomplete`` with an escalation listing each
        effect left standing and the forward action a human might take
        (:attr:`left_standing`).
        """
        done = compensation.compensate(self, reason)
        if finish:
            compensation.finish(self, reason)
        return done

    @property
    def left_standing(self) -> list[StepState]:
        """Effects of this workflow that happened and were not undone."""
        with self._lock:
            return compensation.standing(self.state)

    def finish(
        self, status: WorkflowStatus = WorkflowStatus.COMPLETED, detail: str | None = None
    ) -> None:
        """Record that the workflow ended; finishing it again the same way changes nothing."""
        event = self._finished(status, detail)
        if event is not None:
            self.record(event)

    async def afinish(
        self, status: WorkflowStatus = WorkflowStatus.COMPLETED, detail: str | None = None
    ) -> None:
        """Record that the workflow ended (asyncio): the event loop is not blocked meanwhile."""
        event = self._finished(status, detail)
        if event is not None:
            await self.arecord(event)

    def _finished(self, status: WorkflowStatus, detail: str | None) -> ev.Event | None:
        """The event that ends the workflow ``status``; None when it already ended so."""
        if self.state.status is not RunStatus.RUNNING:
            if self.state.status.value == status.value:
                return None
            raise LedgerStateError(
                f"workflow {self.workflow_id!r} already ended {self.state.status.value}",
                workflow_id=self.workflow_id,
            )
        if status is WorkflowStatus.COMPLETED:
            ensure_nothing_open(self.state)
        body = ev.WorkflowFinished(status=status, detail=detail, runner=self.runner)
        return self.ledger.events.envelope(self.workflow_id, None, body)

    def wait_for_approval(self, step_id: str, timeout_s: float) -> StepStatus:
        """Wait up to ``timeout_s`` for a human's decision on a step; return its status.

        Deprecated (nothing calls it): call the step again, which waits for the decision up
        to ``ResumeOptions.approval_wait_s`` and raises ApprovalPendingError past it.
        """
        warnings.warn(
            "Workflow.wait_for_approval is deprecated and goes in the next minor version: "
            "call the step again (it waits up to ResumeOptions.approval_wait_s)",
            DeprecationWarning,
            stacklevel=2,
        )
        self.settle_pending()
        return approval.await_decision(self, step_id, timeout_s)

    # -- one step call ---------------------------------------------------------------------

    def _prepare(self, step_id: str, tool: Tool, args: dict[str, Any]) -> Move:
        """Match the call against the log and clear what stands in its way; RUN/RERUN/REPLAY."""
        self._tools.setdefault(tool.name, tool)
        if step_id in self.state.steps:
            self.settle_pending()  # settling and approvals read the log: it must hold ours
        with self._lock:
            replaying, position = self._claim(step_id, tool, args)
        for _ in range(_MAX_ROUNDS):
            with self._lock:
                move = next_move(self.state, step_id, tool, position=position, replaying=replaying)
            kind = move.kind
            if kind in (MoveKind.REPLAY, MoveKind.RERUN):
                return move
            if kind is MoveKind.RUN:
                self._ensure_may_run(step_id, tool)
                # Approval binding: an approval of another call (or an expired one) asks again.
                if not approval.ask_again(self, step_id, tool, args):
                    return move
            elif kind is MoveKind.SETTLE:
                settling.settle(self, step_id, tool)
            elif kind is MoveKind.REQUEST_APPROVAL:
                self._ensure_may_run(step_id, tool)
                approval.request(self, step_id, tool, args)
            elif kind is MoveKind.AWAIT_APPROVAL:
                # The pending request must show this call, else it is asked again.
                approval.ask_again(self, step_id, tool, args)
                self._await_approval(step_id)
            elif kind is MoveKind.ESCALATE_FAILURE:
                assert move.step is not None
                self.record(escalation.failure_escalation(self, move.step))
            else:
                raise refusal(self.workflow_id, move, step_id)
        raise LedgerStateError(f"step {step_id!r} did not settle", workflow_id=self.workflow_id)

    def _claim(self, step_id: str, tool: Tool, args: dict[str, Any]) -> tuple[bool, int]:
        """Give a step call its position; the first call of a step in this run is checked."""

        def check(position: int) -> None:
            shown, fingerprint = self.ledger.events.recorded_arguments(
                self.workflow_id, step_id, tool, args
            )
            problem = mismatch(
                self.state,
                step_id,
                tool.name,
                fingerprint,
                position,
                self._order.steps_by_position(self.state),
                legacy=lambda: tool.legacy_digest(args),
                shown=lambda: shown,
            )
            if problem is not None:
                known = self._order.steps_by_position(self.state)
                now = self.ledger.events.versions()
                versions = mismatch_versions(self.state, step_id, position, known, now)
                raise PlanMismatchError(
                    f"{problem}; {versions}", workflow_id=self.workflow_id, step_id=step_id
                )

        return self._order.claim(self.state, step_id, self._recorded_until, check)

    def _ensure_may_run(self, step_id: str, tool: Tool) -> None:
        if steering.holds(self.state, step_id):  # learnt while settling: nothing recorded
            raise steering.halted_error(self.state, step_id)
        if self.state.status is not RunStatus.RUNNING:
            raise LedgerStateError(
                f"workflow {self.workflow_id!r} is {self.state.status.value}: no new steps run",
                workflow_id=self.workflow_id,
                step_id=step_id,
            )
        with self._lock:
            found = step_violations(self.state, step_id, tool)
        if found:
            escalation.refuse(self, step_id, tool, found)

    def _await_approval(self, step_id: str) -> None:
        status = approval.await_decision(self, step_id, self.ledger.options.approval_wait_s)
        if status is StepStatus.AWAITING_APPROVAL:
            raise ApprovalPendingError(
                f"step {step_id!r} awaits approval of its call: `stepledger approvals show "
                f"{shell_arg(self.workflow_id)} {shell_arg(step_id)}` shows it, "
                f"`stepledger approve {shell_arg(self.workflow_id)} {shell_arg(step_id)} "
                "--digest D` approves it",
                workflow_id=self.workflow_id,
                step_id=step_id,
            )

    def _fold(self, event: ev.Event) -> None:
        """Fold an event this handle recorded (the caller holds the lock)."""
        if self._read is not None:
            # The first event this handle folds.  A claim's read back follows: what was read
            # stays apart for it (see _refold).  Anything else keeps nothing.
            if KEEP_READ_FOLD and type(event.body) is ev.WorkflowResumed:
                self._base = (self._read, self.state.copy())
            self._read = None
        self.state.apply(event)

    def _folded(self, event: ev.Event, position: Position) -> None:
        with self._lock:
            self._fold(event)
            self.position = position
            self._synced = fence.next_synced(self._synced, position)
            self.appended += 1
            body = event.body
            if isinstance(body, _CLAIMS_AND_ENDS):
                claim = ev.WorkflowStarted | ev.WorkflowResumed
                if isinstance(body, claim) and body.runner == self.runner:
                    self.epoch = body.attempt
                # Until the history reads this, it never answers a hint as if this had
                # not happened.
                self.ledger.history.wrote(self.workflow_id, position)


#: The events whose own writing a tailing reader must note (what an open claims from).
_CLAIMS_AND_ENDS = (
    ev.WorkflowStarted,
    ev.WorkflowResumed,
    ev.WorkflowFinished,
    ev.WorkflowDeadLettered,
)


def _begins_with(events: list[ev.Event], ids: list[str]) -> bool:
    """True when ``events`` begin with the events of these ids, in this order."""
    return len(events) >= len(ids) and all(
        event.event_id == event_id for event, event_id in zip(events, ids, strict=False)
    )


def _through(events: list[ev.Event], event_id: str) -> list[ev.Event]:
    """The events up to and including the one of ``event_id`` (all of them without it)."""
    for index in range(len(events) - 1, -1, -1):
        if events[index].event_id == event_id:
            return events if index == len(events) - 1 else events[: index + 1]
    return events


def _last_position(state: WorkflowState) -> int:
    return max((s.sequence for s in state.steps.values()), default=-1)


def plan_step(step: PlanStep | tuple[str, Tool]) -> PlanStep:
    return step if isinstance(step, PlanStep) else PlanStep(*step)

"""One step call, written once: the protocol as a generator, driven sync or on an event loop.

A step's protocol (prepare -> intent recorded and checked -> call -> outcome recorded ->
outcome stands) is :meth:`Workflow._protocol`, a generator that yields the I/O it needs
(an :data:`Op`) and receives the answer, or has the error thrown in.  :func:`drive` answers
on the caller's thread (``Workflow.step``), :func:`adrive` on an event loop
(``Workflow.astep``): they differ only in how they wait, so the two cannot drift apart (the
sans-I/O pattern of h11 and hyper-h2).  The helpers below build and judge one call.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stepledger import tracing
from stepledger.domain import events as ev
from stepledger.domain import oversize
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.replay import Move, MoveKind
from stepledger.domain.results import Encoded
from stepledger.domain.saga import pivot_may_have_passed
from stepledger.domain.secrets import Scrubber
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Tool
from stepledger.errors import ResultTypeError, StepInDoubtError, ToolDefinitionError
from stepledger.producer import fence, settling
from stepledger.producer._refusals import refusal
from stepledger.producer.session import WorkflowHandle

if TYPE_CHECKING:
    from stepledger.kafka import Position


class StepHost(WorkflowHandle, Protocol):
    """What the drivers ask of a workflow besides a helper's handle: the asyncio twins."""

    async def arecord(self, event: ev.Event) -> Position:
        """Append an event durably (asyncio), then fold it in."""

    def settle_pending(self) -> None:
        """Wait until a pipelined outcome is acknowledged."""

    async def asettle_pending(self) -> None:
        """Await a pipelined outcome's acknowledgement."""


@dataclass(frozen=True, slots=True)
class Record:
    """Append an event durably and fold it; answered with its position."""

    event: ev.Event


@dataclass(frozen=True, slots=True)
class Settle:
    """Wait until a pipelined outcome is acknowledged (settling and approvals read the log)."""


@dataclass(frozen=True, slots=True)
class Blocking:
    """Run a part that may block on the log (a read back, a wait): off an event loop."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait a while without holding a thread (a paused workflow's wait for its unpause)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Call:
    """Call the tool; answered with its result, or its error thrown in."""

    run: Callable[..., Any]
    arguments: dict[str, Any]
    key: str


Op = Record | Settle | Blocking | Sleep | Call
StepProtocol = Generator[Op, Any, Any]


class _Run:
    """A protocol being driven: hands out its next op and takes the answer (or the error)."""

    __slots__ = ("protocol", "result", "sent", "thrown")

    def __init__(self, protocol: StepProtocol) -> None:
        self.protocol = protocol
        self.sent: Any = None
        self.thrown: BaseException | None = None
        self.result: Any = None

    def next(self) -> Op | None:
        """The next op, or None once the protocol returned (its value is ``result``)."""
        sent, thrown, self.sent, self.thrown = self.sent, self.thrown, None, None
        try:
            return self.protocol.send(sent) if thrown is None else self.protocol.throw(thrown)
        except StopIteration as stop:
            self.result = stop.value
            return None


def drive(workflow: StepHost, protocol: StepProtocol) -> Any:
    """Run a protocol on this thread: every op is answered by waiting for it."""
    run = _Run(protocol)
    while (op := run.next()) is not None:
        try:
            run.sent = _answer(workflow, op)
        except BaseException as exc:  # thrown in: the protocol decides what it means
            run.thrown = exc
    return run.result


async def adrive(workflow: StepHost, protocol: StepProtocol) -> Any:
    """Run a protocol on an event loop: what blocks is awaited or goes to a thread."""
    run = _Run(protocol)
    while (op := run.next()) is not None:
        try:
            run.sent = await _aanswer(workflow, op)
        except BaseException as exc:  # thrown in: the protocol decides what it means
            run.thrown = exc
    return run.result


def _answer(workflow: StepHost, op: Op) -> Any:
    if isinstance(op, Record):
        return workflow.record(op.event)
    if isinstance(op, Settle):
        return workflow.settle_pending()
    if isinstance(op, Blocking):
        return op.fn(*op.args)
    if isinstance(op, Sleep):
        return time.sleep(op.seconds)
    return op.run(op.arguments, op.key)


async def _aanswer(workflow: StepHost, op: Op) -> Any:
    if isinstance(op, Record):
        return await workflow.arecord(op.event)
    if isinstance(op, Settle):
        return await workflow.asettle_pending()
    if isinstance(op, Blocking):
        return await workflow.ledger.off_loop(op.fn, *op.args)
    if isinstance(op, Sleep):
        return await asyncio.sleep(op.seconds)
    if inspect.iscoroutinefunction(op.run):
        return await op.run(op.arguments, op.key)
    return await asyncio.to_thread(op.run, op.arguments, op.key)


@dataclass(slots=True)
class PendingCall:
    """One call of a step: its intent (None for a read-only re-run), key and limits."""

    event: ev.Event | None
    step_id: str
    key: str
    arguments: dict[str, Any]
    attempt: int
    scrub: Scrubber
    """Removes this call's secret values from what its outcome records."""
    budget: fence.Budget | None
    """The intent's deadline on this runner's monotonic clock (None for a read-only re-run)."""
    record_limit: int
    """The most bytes its result may take in the outcome (a larger one: its digest)."""

    def past_deadline(self) -> bool:
        """True when recovery may have decided the step while the call ran (monotonic clock)."""
        return self.budget is not None and self.budget.passed()


def call_for(
    workflow: WorkflowHandle, step_id: str, tool: Tool, args: dict[str, Any], move: Move
) -> PendingCall:
    """The call a RUN or RERUN move makes: a new intent, or the recorded one re-run."""
    ledger = workflow.ledger
    # The first read of the record limit may ask the broker: before the intent, never
    # between a call's effect and its outcome.
    limit = ledger.record_limit
    scrub = tool.scrubber(args)
    if move.kind is MoveKind.RERUN:
        # A read-only call in doubt runs again under its recorded intent and key.
        step = move.step
        assert step is not None
        key, attempt = step.idempotency_key, step.attempt
        return PendingCall(None, step_id, key, args, attempt, scrub, None, limit)
    with workflow.lock:
        after_pivot = tool.effectful and pivot_may_have_passed(workflow.state, step_id)
    # The budget starts before the intent's deadline is computed, so the runner's own
    # clock never allows a call later than the deadline recovery goes by.
    budget = fence.Budget.start(tool, ledger.clock, ledger.timer)
    event = ledger.events.intent(
        workflow.workflow_id,
        step_id,
        tool,
        args,
        sequence=move.sequence,
        attempt=move.attempt,
        after_pivot=after_pivot,
        key=move.key,
        epoch=workflow.epoch,
        runner=workflow.runner,
    )
    body = event.body
    assert isinstance(body, ev.StepIntended)
    key = body.idempotency_key
    return PendingCall(event, step_id, key, args, move.attempt, scrub, budget, limit)


def outcome(
    workflow: WorkflowHandle,
    call: PendingCall,
    status: OutcomeStatus,
    *,
    result: Encoded | None = None,
    error: BaseException | None = None,
) -> ev.Event:
    """The outcome event of a call."""
    return workflow.ledger.events.outcome(
        workflow.workflow_id,
        call.step_id,
        attempt=call.attempt,
        status=status,
        result=None if result is None else result.value,
        result_type=None if result is None else result.result_type,
        error=error,
        scrub=call.scrub,
        runner=workflow.runner,
    )


def digest_outcome(
    workflow: WorkflowHandle, call: PendingCall, encoded: Encoded
) -> tuple[Encoded, ev.Event]:
    """The outcome again with its result as a digest: the step log refused it as too large
    (its own limit could not be read).  The effect happened: it is recorded, not retried."""
    kept = oversize.fitted(encoded, 0)
    return kept, outcome(workflow, call, OutcomeStatus.SUCCEEDED, result=kept)


def ensure_outcome_stands(workflow: WorkflowHandle, call: PendingCall) -> None:
    """After a call that outlived its deadline, go by the log's first decision.

    Recovery never decides a step before its deadline, so a call that ended in time has
    no competitor and costs no read (the caller asks only past it, sync or async alike).
    Past it, the log is read back: if another decision came first (recovery compensated or
    answered the step), ours is a late outcome and the agent must not go on as if its
    effect stood.
    """
    workflow.reload()
    step = workflow.state.steps.get(call.step_id)
    if step is not None and step.attempt != call.attempt:
        # The log moved the step to another attempt while this call ran: whatever it
        # says of that attempt is not this call's effect.
        raise _late(
            workflow.workflow_id,
            call,
            step,
            f"the log moved it to attempt {step.attempt} while this run's call (attempt "
            f"{call.attempt}) ran past its deadline; the late outcome",
        )
    if step is None or step.status is StepStatus.SUCCEEDED:
        return  # ours stands, or recovery found the same effect of this attempt first
    if step.status is StepStatus.COMPENSATING:
        # Recovery's compensation is under way: see it through before going on.
        step = settling.settle(workflow, call.step_id, workflow.tool(step.tool))
    if step.status in (StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED):
        raise refusal(workflow.workflow_id, Move(MoveKind.UNDONE, step), call.step_id)
    raise _late(
        workflow.workflow_id,
        call,
        step,
        f"the log decided it {step.status.value} "
        f"({step.resolved_by.value if step.resolved_by else 'unknown'}) before this run's "
        "outcome arrived; the conflict",
    )


def _late(workflow_id: str, call: PendingCall, step: StepState, what: str) -> StepInDoubtError:
    """A late outcome's error: ``what`` happened, and it goes to a human."""
    return StepInDoubtError(
        f"step {call.step_id!r}: {what} goes to a human (`stepledger escalations list`)",
        workflow_id=workflow_id,
        step_id=call.step_id,
        tool=step.tool,
    )


def left_in_doubt(
    workflow_id: str, call: PendingCall, tool: Tool, exc: BaseException
) -> StepInDoubtError:
    """The error of an effectful call whose effect is unknown: its intent stays open."""
    # Recording "failed" here would let a retry repeat an effect that may have happened:
    # the intent stays open and the tool's policy decides (recovery daemon or resume).
    # A read-only call has no effect to be in doubt about (and recovery never settles
    # its intent): its timeout is recorded as failed, as any other error.
    return StepInDoubtError(
        f"step {call.step_id!r} ({tool.name}): the call's effect is unknown after "
        f"{type(exc).__name__}: {call.scrub.text(str(exc))}; it stays in doubt until its "
        f"{tool.resolution.value} policy resolves it",
        workflow_id=workflow_id,
        step_id=call.step_id,
        tool=tool.name,
    )


def recorded_result(tool: Tool, step: StepState | None) -> Any:
    """What a step the log settled returns on replay (its failure raises)."""
    tracing.replayed(step)
    if step is None or step.result_json is None:
        return None
    oversize.ensure_kept(tool, step)
    try:
        return tool.results.decode(step.result_json, step.result_type)
    except ResultTypeError as exc:
        exc.step_id = step.step_id
        raise


def ensure_replayable(tool: Tool, step_id: str, encoded: Encoded) -> None:
    """Raise once the outcome is recorded if the result would not replay as it was returned."""
    oversize.ensure_fits(tool, step_id, encoded)
    if encoded.problem is not None:
        raise ResultTypeError(
            f"step {step_id!r} ({tool.name}): the result was recorded, but a replay could not "
            f"return it as it is: {encoded.problem}; declare result_type (or annotate the "
            "tool's function) with a type the SDK can round-trip",
            step_id=step_id,
            tool=tool.name,
        )


def runner(tool: Tool, fn: Callable[..., Any] | None, *, on_loop: bool) -> Callable[..., Any]:
    """The tool's run hook (``fn`` first), traced; an async one only on an event loop."""
    run = fn or tool.run
    if run is None:
        raise ToolDefinitionError(
            f"tool {tool.name!r} has no run hook and no fn was given", tool=tool.name
        )
    if not on_loop and inspect.iscoroutinefunction(run):
        raise ToolDefinitionError(
            f"tool {tool.name!r} is async: call it with `await wf.astep(...)`", tool=tool.name
        )
    return tracing.traced_call(run, tool.name)

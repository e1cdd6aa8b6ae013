"""Opening a workflow: read its events, claim it, and start, restart, resume or dead-letter it.

``open_workflow`` is what :meth:`Ledger.workflow` does: read the workflow's events, fold
them, then start it (first run), restart it (a read-only workflow starts over), resume it
(a ``WorkflowResumed`` claim with the attempt number, then settling what is in doubt:
:mod:`stepledger.producer.settling`) or, past its limit, dead-letter it.  Where the
history knows the id without a round trip, a first run or a resume claims first and reads
through its claim (:func:`from_tail`, :func:`held`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, NoReturn

from stepledger import tracing
from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain.saga import PlanRules, PlanStep, Violation, ensure_plan
from stepledger.domain.state import RunStatus, WorkflowState
from stepledger.errors import WorkflowDeadLetteredError
from stepledger.producer import fence
from stepledger.producer.session import Session
from stepledger.producer.settling import settle_known
from stepledger.producer.workflow import Workflow
from stepledger.terminal import shell_arg

STAGE = "resume"
logger = logging.getLogger(__name__)
#: Plan warnings already logged by this process (each once; bounded, plans are few).
_warned: set[str] = set()
_warned_lock = threading.Lock()
_WARNED_KEPT = 1024


@dataclass(frozen=True)
class WorkflowSpec:
    """What the caller declares when it opens a workflow (the log wins where it disagrees)."""

    name: str = ""
    read_only: bool = False
    max_attempts: int = 5
    plan: tuple[PlanStep, ...] | None = None
    reason: str | None = None
    operator: str | None = None
    """An operator's command opens it (a cancel, a restart): its claim names them and counts
    no attempt, so a workflow at its limit is claimed, not dead-lettered."""


@tracing.traced_open
def open_workflow(ledger: Session, workflow_id: str, spec: WorkflowSpec) -> Workflow:
    """Start, restart or resume a workflow from its log; past its limit, dead-letter it."""
    guessed = from_tail(ledger, workflow_id, spec)
    if guessed is not None:
        claimed = first_claim(guessed, spec)
        guessed.reload(through=guessed.record(claimed))
        if not held(guessed, spec):
            return go_on(guessed, spec)
        if not alone(guessed, claimed):
            settle_at_open(guessed, spec)
        return guessed
    workflow = read_for_open(ledger, workflow_id, spec)
    if workflow.state.attempt == 0:
        workflow.record(first_run(workflow, spec))
        return workflow
    return go_on(workflow, spec)


@tracing.traced_aopen
async def aopen_workflow(
    ledger: Session, workflow_id: str, spec: WorkflowSpec, pool: Executor
) -> Workflow:
    """:func:`open_workflow` from a coroutine: the reads on ``pool``, a first run's start
    (or a claim made from the tail) recorded on the event loop, as ``astart`` records it,
    so it may share a request."""
    loop = asyncio.get_running_loop()

    def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
        call = functools.partial(fn, *args, **kwargs)
        return loop.run_in_executor(pool, contextvars.copy_context().run, call)

    guessed = from_tail(ledger, workflow_id, spec)
    if guessed is not None:
        claimed = first_claim(guessed, spec)
        position = await guessed.arecord(claimed)
        await off_loop(guessed.reload, through=position)
        if not held(guessed, spec):
            await off_loop(go_on, guessed, spec)  # raises, or goes on with the same handle
        elif not alone(guessed, claimed):
            await off_loop(settle_at_open, guessed, spec)
        return guessed
    workflow: Workflow = await off_loop(read_for_open, ledger, workflow_id, spec)
    if workflow.state.attempt == 0:
        await workflow.arecord(first_run(workflow, spec))
        return workflow
    await off_loop(go_on, workflow, spec)
    return workflow


def from_tail(ledger: Session, workflow_id: str, spec: WorkflowSpec) -> Workflow | None:
    """The workflow as its history knows it without a round trip, when an open may claim
    it first.

    The history knows the id's whole history (:meth:`WorkflowHistory.known`): none (a first
    run: its started event is recorded first), or running and resumable (a resume: its
    claim is recorded first).  Either way the log is then read only through that record
    (``read(..., through=)``): everything acknowledged before it lies below it, so no
    fresh end is waited for.  What the hint had not seen yet is in that read, and
    :func:`held` judges the claim on it.  None: read first (any other case).  A plan is
    checked before anything is recorded.
    """
    known = ledger.history.known(workflow_id)
    if known is None:
        return None
    workflow = Workflow(ledger, workflow_id, known.events)
    if known.events:
        state = workflow.state
        resumable = state.status is RunStatus.RUNNING and not state.read_only and state.attempt
        past_limit = state.attempt + 1 > state.max_attempts and spec.operator is None
        if not resumable or past_limit:
            return None  # finished, restarted, dead-lettered: the read-first path decides
    check_plan(workflow, spec)
    return workflow


def first_claim(workflow: Workflow, spec: WorkflowSpec) -> ev.Event:
    """The started event of an unseen id, or the next attempt's claim of a running one."""
    state = workflow.state
    if state.attempt == 0:
        return first_run(workflow, spec)
    return workflow.ledger.events.workflow_resumed(
        workflow.workflow_id,
        attempt=state.attempt + 1,
        reason=spec.reason,
        runner=workflow.runner,
        operator=spec.operator,
    )


def held(workflow: Workflow, spec: WorkflowSpec) -> bool:
    """True when a claim recorded from the tail holds the workflow, read back through itself.

    It holds when the fold gives this runner the attempt it claimed and the workflow is
    running.  Otherwise another runner's claim (or the workflow's end) landed first, past
    where the tail had read: this claim owns nothing, and the caller goes on as a read-first
    open that read after that record would (:func:`go_on`: it claims the next attempt,
    replays a finished workflow, or raises for a dead-lettered one), the plan checked
    against what the log says first.
    """
    state = workflow.state
    running = state.status is RunStatus.RUNNING
    if running and state.attempt == workflow.epoch and state.runner == workflow.runner:
        return True
    check_plan(workflow, spec)
    return False


def alone(workflow: Workflow, claimed: ev.Event) -> bool:
    """True when the claim is the workflow's only event (a first run: nothing to settle)."""
    return workflow.state.seen == {claimed.event_id}


def read_for_open(ledger: Session, workflow_id: str, spec: WorkflowSpec) -> Workflow:
    """The workflow as its log holds it (nothing recorded yet); a plan is checked first."""
    # The producer gets its connection and id while the log is read, not after.
    ledger.log.connect()
    history = ledger.history.read(workflow_id)
    workflow = Workflow(ledger, workflow_id, history.events, history.appended)
    check_plan(workflow, spec)
    return workflow


def check_plan(workflow: Workflow, spec: WorkflowSpec) -> None:
    """Check the declared plan against the workflow as read (the log's read-only flag wins)."""
    if spec.plan is None:
        return
    state = workflow.state
    read_only = state.read_only if state.attempt else spec.read_only
    rules = PlanRules(read_only=read_only)
    warn_once(ensure_plan(spec.plan, rules, workflow_id=workflow.workflow_id))


def warn_once(warnings: tuple[Violation, ...]) -> None:
    """Log each plan warning once per process: what the author accepted runs as declared."""
    for warning in warnings:
        text = str(warning)
        with _warned_lock:
            if text in _warned:
                continue
            if len(_warned) >= _WARNED_KEPT:
                _warned.clear()
            _warned.add(text)
        logger.warning("plan: %s", text)


def first_run(workflow: Workflow, spec: WorkflowSpec) -> ev.Event:
    """The started event of a workflow the log does not hold yet."""
    return _started(workflow, spec, 1, spec.read_only, spec.max_attempts)


def go_on(workflow: Workflow, spec: WorkflowSpec) -> Workflow:
    """Open a workflow the log holds: replay it finished, restart, resume or dead-letter it."""
    state = workflow.state
    if state.status is RunStatus.DEAD_LETTERED:
        raise dead_lettered_error(state, state.escalation_id or "?")
    if state.status is not RunStatus.RUNNING:
        return workflow  # finished: steps replay their results, nothing new runs
    attempt = state.attempt + 1
    if attempt > state.max_attempts and spec.operator is None:
        return end_past_limit(workflow, attempt)
    if state.read_only:
        # A read-only workflow is started over: the fold forgets its earlier steps.
        started = _started(workflow, spec, attempt, True, state.max_attempts)
        workflow.record(started)
        return workflow
    claim(workflow, attempt, spec.reason, spec.operator)
    settle_at_open(workflow, spec)
    return workflow


def settle_at_open(workflow: Workflow, spec: WorkflowSpec) -> None:
    """Settle the in-doubt steps a resume finds, unless an operator's pause holds recovery.

    Held, a runner leaves them in doubt as the recovery daemons do: it is paused anyway, and
    a step it asks for again is held before it is settled, so it is settled once unpaused.
    An operator's own open (a cancel, a restart carried through) settles them: the operator
    decided.
    """
    if workflow.state.recovery_held_by is None or spec.operator is not None:
        settle_known(workflow)


def claim(
    workflow: Workflow, attempt: int, reason: str | None, operator: str | None = None
) -> None:
    """Claim the workflow as ``attempt`` and read the log again from the claim's side.

    Whatever another runner appended before the claim is in the state read afterwards (an
    intent it wrote while this runner read is settled, never run past); whatever it appends
    after is fenced off by the fold.  Two runners claiming the same attempt: the first claim
    in the log owns the workflow, the other raises WorkflowTakenOverError.
    """
    ledger = workflow.ledger
    resumed = ledger.events.workflow_resumed(
        workflow.workflow_id,
        attempt=attempt,
        reason=reason,
        runner=workflow.runner,
        operator=operator,
    )
    workflow.reload(through=workflow.record(resumed))
    fence.ensure_claimed(workflow.state, workflow.runner, workflow.epoch)


def end_past_limit(workflow: Workflow, attempt: int) -> Workflow:
    """Claim the attempt past the limit, then dead-letter the workflow under that claim.

    The claim fences off a runner that may still be alive (a slow process, not a dead one):
    whatever it writes after the claim (an intent, a compensation) decides nothing and it
    calls nothing, so no effect follows the dead letter.  Only the process whose claim the
    log took dead-letters the workflow: another's claim first raises
    WorkflowTakenOverError, and a workflow that ended before the claim is left as it ended.
    """
    claim(workflow, attempt, f"resume_limit: attempt {attempt} is past the limit")
    state = workflow.state
    if state.status is RunStatus.DEAD_LETTERED:
        raise dead_lettered_error(state, state.escalation_id or "?")
    if state.status is not RunStatus.RUNNING:
        return workflow  # finished before the claim: steps replay their results
    dead_letter(workflow, attempt)


def dead_letter(workflow: Workflow, attempt: int) -> NoReturn:
    """Record that the workflow passed its limit, publish a dead letter, and raise."""
    ledger, state = workflow.ledger, workflow.state
    # Named after the first attempt past the limit, not the one claimed: a process that
    # dies between its claim and the dead letter leaves the next one the same escalation.
    limit = state.max_attempts + 1
    escalation = ids.escalation_id(workflow.workflow_id, None, "resume_limit", limit)
    reason = f"resume_limit: attempt {attempt} exceeds the limit of {state.max_attempts} attempts"
    body = ev.WorkflowDeadLettered(attempt=attempt, reason=reason, escalation_id=escalation)
    event = ledger.events.envelope(workflow.workflow_id, None, body, attempt)
    # The dead letter first: if the process dies between the two, the next resume does
    # both again (a duplicate dead letter) rather than leave the event without its letter.
    ledger.dead_letters.publish(event, reason=reason)
    workflow.record(event)
    raise dead_lettered_error(workflow.state, escalation)


def dead_lettered_error(state: WorkflowState, escalation: str) -> WorkflowDeadLetteredError:
    """The error a resume of a dead-lettered workflow raises, naming how to clear it."""
    wf = state.workflow_id
    return WorkflowDeadLetteredError(
        f"workflow {wf!r} is dead-lettered at attempt {state.attempt} "
        f"(escalation {escalation}); a human clears it with "
        f"`stepledger workflows clear {shell_arg(wf)} --by NAME`",
        escalation_id=escalation,
        workflow_id=wf,
    )


def _started(
    workflow: Workflow, spec: WorkflowSpec, attempt: int, read_only: bool, limit: int
) -> ev.Event:
    return workflow.ledger.events.workflow_started(
        workflow.workflow_id,
        name=spec.name,
        attempt=attempt,
        read_only=read_only,
        max_attempts=limit,
        runner=workflow.runner,
    )

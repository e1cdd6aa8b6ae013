"""Re-entering a workflow: replay its events, count the attempt, settle what is in doubt.

``open_workflow`` is what :meth:`Ledger.workflow` does: read the workflow's events, fold
them, then start it (first run), restart it (a read-only workflow starts over), resume it
(a ``WorkflowResumed`` with the attempt number) or, past its limit, dead-letter it.

In-doubt steps are resolved by the recovery daemon's own :class:`Resolver` (one code path).
A previous run of the agent may still be alive and inside the call (slow, not dead), so a
resolution waits until the intent's deadline plus a grace has passed, as the daemon does,
unless a query hook *finds* the effect: that settles the step at once (asked once, before
waiting; "not found" proves nothing until the deadline);
``ResumeOptions.wait_for_recovery`` leaves the decision to the daemon and waits for it
instead. Whatever the agent appended while settling, it then reads the workflow back and
goes on with the log's first decision for each step, whoever wrote it (the daemon may have
decided the same step a moment before). A compensatable step that can be queried is looked
up rather than compensated (``forward_query``): the agent is resuming to go forward, and a
found effect is kept instead of undone and done again."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from stepledger import tracing
from stepledger.deadletters.letter import max_message_bytes
from stepledger.domain import events as ev
from stepledger.domain import ids, oversize
from stepledger.domain import resolution as rs
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.saga import PlanRules, PlanStep, ensure_plan
from stepledger.domain.state import RunStatus, StepState, StepStatus, WorkflowState
from stepledger.domain.tools import Tool
from stepledger.errors import StepInDoubtError, WorkflowDeadLetteredError
from stepledger.producer import fence
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver, reader_check
from stepledger.terminal import shell_arg

if TYPE_CHECKING:
    from stepledger.producer.ledger import Ledger
    from stepledger.producer.workflow import Workflow

STAGE = "resume"
_MAX_ROUNDS = 1000


@dataclass(frozen=True)
class ResumeOptions:
    """How workflows come back after a crash and how long the SDK waits on others."""

    grace_s: float = 0.5
    """Extra wait past an in-doubt intent's deadline before resolving it (a slow run's margin)."""
    resolve_timeout_s: float = 120.0
    """Longest a resume waits to settle one in-doubt step before raising StepInDoubtError."""
    wait_for_recovery: bool = False
    """Leave in-doubt steps to the recovery daemon and wait for its decision instead."""
    forward_query: bool = True
    """Query a compensatable in-doubt step that has a query hook instead of compensating it."""
    approval_wait_s: float = 0.0
    """How long a step waits for a human approval before raising ApprovalPendingError."""


@dataclass(frozen=True)
class WorkflowSpec:
    """What the caller declares when it opens a workflow (the log wins where it disagrees)."""

    name: str = ""
    read_only: bool = False
    max_attempts: int = 5
    plan: tuple[PlanStep, ...] | None = None
    reason: str | None = None


@tracing.traced_open
def open_workflow(ledger: Ledger, workflow_id: str, spec: WorkflowSpec) -> Workflow:
    """Start, restart or resume a workflow from its log; past its limit, dead-letter it."""
    from stepledger.producer.workflow import Workflow

    connect = getattr(ledger.log, "connect", None)
    if callable(connect):
        # The producer gets its connection and id while the log is read, not after.
        connect()
    workflow = Workflow(ledger, workflow_id, ledger.reader.read(workflow_id))
    state = workflow.state
    read_only = state.read_only if state.attempt else spec.read_only
    if spec.plan is not None:
        ensure_plan(spec.plan, PlanRules(read_only=read_only), workflow_id=workflow_id)
    if state.attempt == 0:
        workflow.record(_started(workflow, spec, 1, spec.read_only, spec.max_attempts))
        return workflow
    if state.status is RunStatus.DEAD_LETTERED:
        raise dead_lettered_error(state, state.escalation_id or "?")
    if state.status is not RunStatus.RUNNING:
        return workflow  # finished: steps replay their results, nothing new runs
    attempt = state.attempt + 1
    if attempt > state.max_attempts:
        dead_letter(workflow, attempt)
    if state.read_only:
        # A read-only workflow is started over: the fold forgets its earlier steps.
        started = _started(workflow, spec, attempt, True, state.max_attempts)
        workflow.record(started)
        return workflow
    claim(workflow, attempt, spec.reason)
    settle_known(workflow)
    return workflow


def claim(workflow: Workflow, attempt: int, reason: str | None) -> None:
    """Claim the workflow as ``attempt`` and read the log again from the claim's side.

    Whatever another runner appended before the claim is in the state read afterwards (an
    intent it wrote while this runner read is settled, never run past); whatever it appends
    after is fenced off by the fold.  Two runners claiming the same attempt: the first claim
    in the log owns the workflow, the other raises WorkflowTakenOverError.
    """
    ledger = workflow.ledger
    resumed = ledger.events.workflow_resumed(
        workflow.workflow_id, attempt=attempt, reason=reason, runner=workflow.runner
    )
    workflow.record(resumed)
    workflow.reload()
    fence.ensure_claimed(workflow.state, workflow.runner, workflow.epoch)


def settle_known(workflow: Workflow) -> None:
    """Settle every in-doubt step whose tool the ledger knows, going by the log's decisions.

    Steps whose tool is unknown here are settled when the agent asks for them again.  Each
    settling reads the workflow back from the log (see :func:`resolve`), so a decision the
    recovery daemon recorded first is the one the agent goes on with.
    """
    ledger = workflow.ledger
    for step in workflow.state.in_doubt() + _compensating(workflow.state):
        tool = ledger.tools.get(step.tool)
        if tool is None or step.effect is EffectClass.READ_ONLY:
            continue
        settle(workflow, step.step_id, tool)


def settle(workflow: Workflow, step_id: str, tool: Tool) -> StepState:
    """Resolve one in-doubt step (or wait for the daemon to) and return its new state."""
    if workflow.ledger.options.wait_for_recovery:
        return wait_for_decision(workflow, step_id)
    return resolve(workflow, step_id, tool)


def resolve(workflow: Workflow, step_id: str, tool: Tool) -> StepState:
    """Resolve an in-doubt step with the recovery Resolver, waiting until it is due."""
    ledger, options = workflow.ledger, workflow.ledger.options
    resolver = _resolver(ledger, tool)
    limit = time.monotonic() + options.resolve_timeout_s
    _settle_if_found(workflow, resolver, step_id, tool)
    for _ in range(_MAX_ROUNDS):
        step = workflow.state.steps[step_id]
        if step.status not in rs.ACTIONABLE:
            return step
        shadow = _forward(workflow.state, step, tool) if options.forward_query else workflow.state
        action = resolver.decide(shadow, step_id)
        if action.kind is rs.ActionKind.NONE:
            break
        if action.kind is rs.ActionKind.WAIT:
            if not _wait_until_due(ledger, action, limit):
                break
            if action.due_at is not None and ledger.clock() >= action.due_at:
                # Due now: the daemon may have decided meanwhile (its grace may be shorter).
                workflow.reload()
            continue
        resolution = resolver.attempt(_copy(shadow), step_id)
        if resolution.events:
            # Never our own fold of what we appended: the log's first decision for the step,
            # whoever wrote it, is what the agent goes on with.
            workflow.reload()
    step = workflow.state.steps[step_id]
    if step.status in rs.ACTIONABLE:
        raise StepInDoubtError(
            f"step {step_id!r} is still in doubt after {options.resolve_timeout_s:g}s",
            workflow_id=workflow.workflow_id,
            step_id=step_id,
            tool=step.tool,
        )
    return step


def _settle_if_found(workflow: Workflow, resolver: Resolver, step_id: str, tool: Tool) -> None:
    """Before waiting out the deadline, ask the query hook once: a found effect settles now.

    Only "found" decides before the deadline (a slow run may still be inside the call);
    "not found" and every other policy wait as before.  The log's first decision stands.
    """
    state = workflow.state
    step = state.steps[step_id]
    if step.status is not StepStatus.INTENDED:
        return
    shadow = _forward(state, step, tool) if workflow.ledger.options.forward_query else state
    if resolver.settle_if_found(_copy(shadow), step_id).events:
        workflow.reload()


def wait_for_decision(workflow: Workflow, step_id: str) -> StepState:
    """Wait for the recovery daemon to settle an in-doubt step (bounded), then return it."""
    options = workflow.ledger.options

    def settled(event: ev.Event) -> bool:
        workflow.adopt([event])
        return workflow.state.steps[step_id].status not in rs.ACTIONABLE

    step = workflow.state.steps[step_id]
    if step.status in rs.ACTIONABLE:
        workflow.ledger.reader.follow(
            workflow.workflow_id, workflow.position, settled, options.resolve_timeout_s
        )
    step = workflow.state.steps[step_id]
    if step.status in rs.ACTIONABLE:
        raise StepInDoubtError(
            f"step {step_id!r}: no recovery decision within {options.resolve_timeout_s:g}s",
            workflow_id=workflow.workflow_id,
            step_id=step_id,
            tool=step.tool,
        )
    return step


def dead_letter(workflow: Workflow, attempt: int) -> None:
    """Record that the workflow passed its limit, publish a dead letter, and raise."""
    ledger, state = workflow.ledger, workflow.state
    escalation = ids.escalation_id(workflow.workflow_id, None, "resume_limit", attempt)
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
        f"workflow {wf!r} is dead-lettered after {state.attempt} attempts "
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


def _resolver(ledger: Ledger, tool: Tool) -> Resolver:
    known = ledger.tools.get(tool.name)
    tools = ledger.tools if known is tool else ToolRegistry([tool])
    grace = timedelta(seconds=ledger.options.grace_s)
    return Resolver(
        ledger.log,
        ledger.events,
        tools,
        dead_letters=ledger.dead_letters,
        clock=ledger.clock,
        grace=grace,
        confirm=reader_check(ledger.reader.read),
        record_limit=oversize.record_limit(max_message_bytes(ledger.settings)),
    )


def _forward(state: WorkflowState, step: StepState, tool: Tool) -> WorkflowState:
    """The state the resolver judges: a queryable compensatable intent is queried instead."""
    if step.policy is not ResolutionPolicy.COMPENSATE or tool.query is None:
        return state
    if not step.undoable or step.status is not StepStatus.INTENDED:
        return state
    shadow = _copy(state)
    shadow.put(replace(step, policy=ResolutionPolicy.QUERY))
    return shadow


def _copy(state: WorkflowState) -> WorkflowState:
    # The resolver folds its events into the state it is given; the workflow's own state
    # takes them from the resolution instead, so a shadow never leaks into it.
    return replace(
        state, steps=dict(state.steps), seen=set(state.seen), anomalies=list(state.anomalies)
    )


def _compensating(state: WorkflowState) -> list[StepState]:
    return [s for s in state.ordered_steps() if s.status is StepStatus.COMPENSATING]


def _wait_until_due(ledger: Ledger, action: rs.Action, limit: float) -> bool:
    """Sleep until the step is due (or briefly, when no due time is known); False past limit."""
    wait = 0.05
    if action.due_at is not None:
        wait = max(0.0, (action.due_at - ledger.clock()).total_seconds())
    remaining = limit - time.monotonic()
    if wait > remaining:
        return False
    # Wake at least once a second so a moved clock is noticed.
    time.sleep(min(max(wait, 0.005), 1.0))
    return True

"""Settling in-doubt steps: the recovery daemon's own resolver, run by a resuming agent.

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
found effect is kept instead of undone and done again.

One clock: the log's recorded times are on their writers' wall clocks, so a resuming agent
goes by the broker's instead, as the recovery daemon does (:class:`Arrivals`): each wait
runs from when the step's events were appended, on this process's clock, as the history
read them (``History.appended``: the broker's append time taken to this clock by an upper
bound of its lead, :mod:`stepledger.history.clock`; the resume's own claim, read back,
bounds that lead by about one round trip).  Whatever the skew between the writer's clock
and this one, the step is never decided before its timeout ran from its intent's append,
and is decided within the timeout plus the grace after it by the broker's clock.  An event
with no broker time (a step log not stamped by the broker, a history that gives none: an
in-memory one, a checkpoint's or a snapshot's head) falls back to the earlier of its
recorded time and the moment this process first held it: a writer's clock ahead of this
one then costs nothing, one behind it lets the step be decided that much early.

The helpers here work on a :class:`~stepledger.producer.session.WorkflowHandle` and its
:class:`~stepledger.producer.session.Session`, never on the workflow class itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.state import StepState, StepStatus, WorkflowState
from stepledger.domain.tools import Tool
from stepledger.errors import StepInDoubtError
from stepledger.producer.session import Session, WorkflowHandle
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver

_MAX_ROUNDS = 1000
Read = tuple[StepState, rs.Arrival]
"""A step as a read folded it, and when its events were appended on this process's clock."""
#: A wait at least this long is said (once per step settled): a person watches the agent.
SAY_WAIT_S = 1.0

logger = logging.getLogger(__name__)


def settle_known(workflow: WorkflowHandle) -> None:
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


def settle(workflow: WorkflowHandle, step_id: str, tool: Tool) -> StepState:
    """Resolve one in-doubt step (or wait for the daemon to) and return its new state."""
    if workflow.ledger.options.wait_for_recovery:
        return wait_for_decision(workflow, step_id)
    return resolve(workflow, step_id, tool)


def resolve(workflow: WorkflowHandle, step_id: str, tool: Tool) -> StepState:
    """Resolve an in-doubt step with the recovery Resolver, waiting until it is due."""
    ledger, options = workflow.ledger, workflow.ledger.options
    resolver = _resolver(workflow, tool)
    limit = ledger.timer.monotonic() + options.resolve_timeout_s
    arrivals = Arrivals(ledger.clock, lambda: workflow.arrivals)
    _settle_if_found(workflow, resolver, step_id, tool, arrivals)
    said = False
    for _ in range(_MAX_ROUNDS):
        step = workflow.state.steps[step_id]
        if step.status not in rs.ACTIONABLE:
            return step
        shadow = _forward(workflow.state, step, tool) if options.forward_query else workflow.state
        arrival = arrivals.of(step)
        action = resolver.decide(shadow, step_id, arrival)
        if action.kind is rs.ActionKind.NONE:
            break
        if action.kind is rs.ActionKind.WAIT:
            if not said:
                said = _say_wait(workflow, step, tool, action, shadow.steps[step_id].policy, limit)
            if not _wait_until_due(ledger, action, limit):
                break
            if action.due_at is not None and ledger.clock() >= action.due_at:
                # Due now: the daemon may have decided meanwhile (its grace may be shorter).
                workflow.reload()
            continue
        resolution = resolver.attempt(_copy(shadow), step_id, arrival)
        if resolution.events:
            # Never our own fold of what we appended: the log's first decision for the step,
            # whoever wrote it, is what the agent goes on with.
            workflow.reload()
    return _settled_or_raise(
        workflow, step_id, f" is still in doubt after {options.resolve_timeout_s:g}s"
    )


def _say_wait(
    workflow: WorkflowHandle,
    step: StepState,
    tool: Tool,
    action: rs.Action,
    policy: ResolutionPolicy | None,
    limit: float,
) -> bool:
    """Say once what a resume waits for, how long and why (a person sees an agent stall).

    A WARNING, so a program that configured no logging still prints it on stderr (Python's
    last-resort handler): the example agents and a first script show it as they are.
    """
    if action.due_at is None:
        return False
    ledger = workflow.ledger
    seconds = (action.due_at - ledger.clock()).total_seconds()
    if seconds < SAY_WAIT_S or seconds > limit - ledger.timer.monotonic():
        return False  # too short to notice, or past the limit: StepInDoubtError says it
    why = (
        "the tool has no query hook, so nothing can show sooner whether the call took effect"
        if tool.query is None
        else "its query hook did not find the effect, which proves nothing before the deadline"
    )
    decides = policy.value if policy is not None else tool.resolution.value
    logger.warning(
        "workflow %s step %s (%s) is in doubt after an earlier run: waiting %.1f s, until its "
        "deadline plus %.1f s of grace, before its %s policy decides it; %s, and the earlier "
        "run may still be inside the call until then (ResumeOptions.wait_for_recovery leaves "
        "the decision to the recovery daemon)",
        workflow.workflow_id,
        step.step_id,
        tool.name,
        seconds,
        ledger.options.grace_s,
        decides,
        why,
        extra={
            "workflow_id": workflow.workflow_id,
            "step_id": step.step_id,
            "tool": tool.name,
            "wait_s": round(seconds, 3),
        },
    )
    return True


def _settle_if_found(
    workflow: WorkflowHandle, resolver: Resolver, step_id: str, tool: Tool, arrivals: Arrivals
) -> None:
    """Before waiting out the deadline, ask the query hook once: a found effect settles now.

    Only "found" decides before the deadline (a slow run may still be inside the call);
    "not found" and every other policy wait as before.  The log's first decision stands.
    """
    state = workflow.state
    step = state.steps[step_id]
    if step.status is not StepStatus.INTENDED:
        return
    shadow = _forward(state, step, tool) if workflow.ledger.options.forward_query else state
    if resolver.settle_if_found(_copy(shadow), step_id, arrivals.of(step)).events:
        workflow.reload()


class Arrivals:
    """When a step's events were appended, on this process's clock: the start of each wait."""

    def __init__(
        self, clock: Callable[[], datetime], read: Callable[[], Mapping[str, Read]] = dict
    ) -> None:
        self._clock = clock
        self._read = read
        """The handle's arrivals as its last read gave them (``WorkflowHandle.arrivals``)."""
        self._held: dict[tuple[object, ...], datetime] = {}

    def of(self, step: StepState) -> rs.Arrival:
        """The step's arrival: by the broker's times while the step is as the handle last
        read it; otherwise, per event, its recorded time unless that is after it was held."""
        read = self._read().get(step.step_id)
        if read is not None and _as_read(read[0], step):
            return read[1]
        intent = self._at(("intent", step.attempt), step.intended_at)
        last = self._at((step.status, step.attempt, step.recovery_attempts), step.last_at)
        return rs.Arrival(intent, last)

    def _at(self, event: tuple[object, ...], recorded: datetime | None) -> datetime | None:
        if recorded is None:
            return None
        # Taken the first time this event is seen here: after it was read, so after its
        # append; the recorded time wins when earlier (this clock is trusted not to lead).
        held = self._held.setdefault((*event, recorded), self._clock())
        return min(recorded, held)


def _as_read(read: StepState, step: StepState) -> bool:
    """True when the step has had no event since the read its arrival came from."""
    return (read.status, read.attempt, read.recovery_attempts, read.last_at) == (
        step.status,
        step.attempt,
        step.recovery_attempts,
        step.last_at,
    )


def wait_for_decision(workflow: WorkflowHandle, step_id: str) -> StepState:
    """Wait for the recovery daemon to settle an in-doubt step (bounded), then return it."""
    options = workflow.ledger.options

    def settled(event: ev.Event) -> bool:
        workflow.adopt([event])
        return workflow.state.steps[step_id].status not in rs.ACTIONABLE

    step = workflow.state.steps[step_id]
    if step.status in rs.ACTIONABLE:
        workflow.ledger.history.follow(
            workflow.workflow_id, workflow.position, settled, options.resolve_timeout_s
        )
    return _settled_or_raise(
        workflow, step_id, f": no recovery decision within {options.resolve_timeout_s:g}s"
    )


def _settled_or_raise(workflow: WorkflowHandle, step_id: str, why: str) -> StepState:
    """The step as the log now tells it; StepInDoubtError while it is still in doubt."""
    step = workflow.state.steps[step_id]
    if step.status in rs.ACTIONABLE:
        raise StepInDoubtError(
            f"step {step_id!r}{why}",
            workflow_id=workflow.workflow_id,
            step_id=step_id,
            tool=step.tool,
        )
    return step


def _resolver(workflow: WorkflowHandle, tool: Tool) -> Resolver:
    """The recovery Resolver, settling for this runner: its compensation claims name it and
    are read back as the runner's own claims are (a runner that lost its workflow
    compensates nothing)."""
    ledger = workflow.ledger
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
        hooks=ledger.hooks,
        confirm=workflow.read_claim,
        record_limit=ledger.record_limit,
        runner=workflow.runner,
        epoch=workflow.epoch,
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
    return state.copy()


def _compensating(state: WorkflowState) -> list[StepState]:
    return [s for s in state.ordered_steps() if s.status is StepStatus.COMPENSATING]


def _wait_until_due(ledger: Session, action: rs.Action, limit: float) -> bool:
    """Sleep until the step is due (or briefly, when no due time is known); False past limit."""
    wait = 0.05
    if action.due_at is not None:
        wait = max(0.0, (action.due_at - ledger.clock()).total_seconds())
    remaining = limit - ledger.timer.monotonic()
    if wait > remaining:
        return False
    # Wake at least once a second so a moved clock is noticed.
    ledger.timer.sleep(min(max(wait, 0.005), 1.0))
    return True

"""One live runner per workflow: the checks a runner makes between its claim and its effect.

Opening a workflow is a claim (``workflow_started``/``workflow_resumed`` naming the runner);
its attempt is the runner's epoch, and every intent, compensation intent and outcome the
runner writes names the runner (intents and compensation intents the epoch too), so two
runners' events are never duplicates of each other.  The fold
(:mod:`stepledger.domain.state`) marks an intent or a compensation intent written under an
epoch that a newer claim before it fenced off as a ``zombie_intent`` /
``zombie_compensation`` anomaly: it decides nothing.

Before every effect it makes (a step call of an effectful tool, keyed or not; a saga's
compensation; an approved call, which is a step call), the runner reads its own claim
(the intent, the compensation intent) back in log order (:func:`ensure_owner`, the
:func:`~stepledger.resolution.claims.read_back` a resolver makes before a compensation):
the effect is made only if the log's fold took that claim; otherwise
:class:`~stepledger.errors.WorkflowTakenOverError` is raised and nothing is called.  A key
does not excuse a call from the read-back: it is derived from the step and its attempt,
so it collides with the owner's call only if the owner makes that very call, and an owner
that compensated or ended the workflow never does (the zombie's charge would be an effect
of no step).  Two effects skip it, both repeats of a claim the log already took, under
the step's own key, that the current owner (and the recovery daemon) make themselves
when they meet the step: a re-drive of an intent in doubt, and carrying through a
compensation whose intent stands.  Read-only calls make no effect and skip it too.

Right before an effectful call the runner checks its own monotonic clock against the
intent's budget (:func:`ensure_in_time`): past the deadline recovery may already have
decided the step, so nothing is called and the step stays in doubt.  A read-only call is
never refused for being late: recovery never decides a read-only step (only its agent
re-runs it), so refusing it would leave the intent open with nobody to settle it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.factory import Clock
from stepledger.domain.state import WorkflowState
from stepledger.domain.tools import Tool
from stepledger.errors import StepInDoubtError
from stepledger.history.protocol import WorkflowHistory
from stepledger.kafka import Position
from stepledger.resolution.claims import ClaimCheck, Standing, read_back, taken_over
from stepledger.timer import SYSTEM_TIMER, Timer

#: How often a read-back is tried when the reader does not return the acknowledged intent
#: yet (a reader that lags the producer); past it nothing is called.
READ_BACK_TRIES = 5


def new_runner() -> str:
    """A runner identity: unique per process and workflow handle, never reused."""
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True, slots=True)
class Budget:
    """An intent's deadline on the runner's own monotonic clock (and on its wall clock)."""

    ends: float
    """The runner's monotonic clock when the intent's timeout runs out (started before the
    intent)."""
    timeout_s: float
    deadline: datetime
    """The deadline the intent records (the runner's wall clock plus the timeout)."""
    clock: Clock
    timer: Timer = SYSTEM_TIMER
    """The runner's monotonic clock."""

    @classmethod
    def start(cls, tool: Tool, clock: Clock, timer: Timer = SYSTEM_TIMER) -> Budget:
        """Start the budget now: called before the intent's deadline is computed."""
        ends = timer.monotonic() + tool.timeout_s
        deadline = clock() + timedelta(seconds=tool.timeout_s)
        return cls(ends, tool.timeout_s, deadline, clock, timer)

    def passed(self) -> bool:
        """True once the deadline passed by either clock (a paused process sees both move)."""
        return self.timer.monotonic() > self.ends or self.clock() > self.deadline


def needs_read_back(tool: Tool) -> bool:
    """True for a call with an effect: only the workflow's owner may make it, keyed or not."""
    return tool.effectful


def ensure_in_time(budget: Budget | None, workflow_id: str, step_id: str, tool: Tool) -> None:
    """Raise StepInDoubtError (nothing called) when the intent's deadline already passed.

    A read-only tool is let through: no daemon resolves its step (it is re-run by its
    agent), so a late read settles it now instead of leaving it intended for good.
    """
    if budget is None or not tool.effectful or not budget.passed():
        return
    late = max(
        budget.timer.monotonic() - budget.ends,
        (budget.clock() - budget.deadline).total_seconds(),
    )
    raise StepInDoubtError(
        f"step {step_id!r} ({tool.name}): the intent's deadline ({budget.timeout_s:g}s) passed "
        f"{late:.1f}s before the call could start (the runner was paused or slow); nothing "
        f"was called and the step stays in doubt until its {tool.resolution.value} policy "
        "resolves it",
        workflow_id=workflow_id,
        step_id=step_id,
        tool=tool.name,
    )


def next_synced(synced: Position | None, landed: Position) -> Position | None:
    """Where a handle's state is still the log's fold after folding its own record ``landed``.

    Only when the record landed right after the one the fold ended at (the workflow's
    records share a partition, invariant 3): then no record of anyone lies between them.
    """
    if synced is None or landed.offset != synced.offset + 1:
        return None
    return landed if (landed.topic, landed.partition) == (synced.topic, synced.partition) else None


def read_claimed(history: WorkflowHistory, claim: ev.Event, position: Position) -> list[ev.Event]:
    """The workflow's events read back through one of this process's claims, at ``position``
    (the fold decides a claim from what lies before it).

    The claim is acknowledged, so a read that reaches it returns it; one that does not
    (bounded retries) returns what it read, without the claim, and nothing may be called.
    """
    events: list[ev.Event] = []
    for _ in range(READ_BACK_TRIES):
        events = history.read(claim.workflow_id, through=position).events
        if any(event.event_id == claim.event_id for event in reversed(events)):
            break
    return events


def ensure_owner(
    confirm: ClaimCheck, claim: ev.Event, epoch: int, position: Position
) -> WorkflowState:
    """Read the runner's own claim (an intent, a compensation intent) back before its effect.

    ``confirm`` is the runner's handle's read back (``Workflow.read_claim``).  Returns the
    workflow as the log has it through the claim.  Raises WorkflowTakenOverError unless
    the log's fold took the claim, StepInDoubtError when it could not be read back; either
    way nothing may be called.
    """
    step_id = claim.step_id or ""
    back = read_back(confirm, claim, position)
    if back.standing is Standing.STANDS and back.state is not None:
        return back.state
    what = "intent" if isinstance(claim.body, ev.StepIntended) else "compensation intent"
    if back.standing is Standing.UNKNOWN or back.state is None:
        raise StepInDoubtError(
            f"step {step_id!r}: this run's {what} could not be read back from the log; "
            "nothing was called and the step stays in doubt",
            workflow_id=claim.workflow_id,
            step_id=step_id,
        )
    why = f"the log recorded its {what} as {back.anomaly}"
    raise taken_over(back.state, step_id, epoch, why)


def ensure_claimed(state: WorkflowState, runner: str, epoch: int) -> None:
    """Raise WorkflowTakenOverError unless the log's fold gives this runner's claim the workflow."""
    if state.attempt < epoch or (state.attempt == epoch and state.runner in (None, runner)):
        return  # ours (or not read back yet: the intents' read-back still guards each call)
    raise taken_over(state, None, epoch, "its claim was not the first of its attempt")

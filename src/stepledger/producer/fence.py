"""One live runner per workflow: the checks a runner makes between its intent and its call.

Opening a workflow is a claim (``workflow_started``/``workflow_resumed`` naming the runner);
its attempt is the runner's epoch, and every intent and outcome the runner writes names
both, so two runners' events are never duplicates of each other.  The fold
(:mod:`stepledger.domain.state`) marks an intent written under an epoch that a newer claim
before it fenced off as a ``zombie_intent`` anomaly: it decides nothing.

Before a call that is not safe to repeat, the runner reads its own intent back in log
order (:func:`ensure_owner`): the call runs only if the log's fold took that intent as
the step's attempt; otherwise :class:`~stepledger.errors.WorkflowTakenOverError` is raised
and nothing is called.  A step that is safe to repeat skips the read-back: its key does
not change across epochs (only a recorded failure moves it), so a second runner's call
collides with the first one at the service.

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
from stepledger.domain.state import WorkflowState, replay
from stepledger.domain.tools import Tool
from stepledger.errors import StepInDoubtError, WorkflowTakenOverError
from stepledger.readers.workflows import WorkflowReader
from stepledger.resolution.resolver import claim_stands
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
    """True for a call that is not safe to repeat: only the workflow's owner may make it."""
    return tool.effectful and not tool.repeatable


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


def ensure_owner(reader: WorkflowReader, intent: ev.Event, epoch: int) -> WorkflowState:
    """Read the runner's own intent back; raise unless the log took it as the step's attempt.

    Returns the workflow as the log has it.  The intent is acknowledged, so a reader that
    reaches the partition's end sees it; one that does not (bounded retries) leaves the
    step in doubt rather than call.
    """
    workflow_id, step_id = intent.workflow_id, intent.step_id or ""
    logged: WorkflowState | None = None
    for _ in range(READ_BACK_TRIES):
        logged = replay(workflow_id, reader.read(workflow_id))
        if intent.event_id in logged.seen:
            break
    if logged is None or intent.event_id not in logged.seen:
        raise StepInDoubtError(
            f"step {step_id!r}: this run's intent could not be read back from the log; "
            "nothing was called and the step stays in doubt",
            workflow_id=workflow_id,
            step_id=step_id,
        )
    if claim_stands(logged, intent):
        return logged
    raise taken_over(logged, step_id, epoch, _refusal(logged, intent))


def ensure_claimed(state: WorkflowState, runner: str, epoch: int) -> None:
    """Raise WorkflowTakenOverError unless the log's fold gives this runner's claim the workflow."""
    if state.attempt < epoch or (state.attempt == epoch and state.runner in (None, runner)):
        return  # ours (or not read back yet: the intents' read-back still guards each call)
    raise taken_over(state, None, epoch, "its claim was not the first of its attempt")


def taken_over(
    state: WorkflowState, step_id: str | None, epoch: int, why: str
) -> WorkflowTakenOverError:
    """The one-line error of a runner that lost its workflow to another."""
    where = f" before step {step_id!r}" if step_id else ""
    return WorkflowTakenOverError(
        f"workflow {state.workflow_id!r} was taken over{where}: runner {state.runner} holds "
        f"attempt {state.attempt}, this runner's was {epoch} ({why}); nothing was called",
        workflow_id=state.workflow_id,
        step_id=step_id,
    )


def _refusal(state: WorkflowState, intent: ev.Event) -> str:
    kinds = [a.kind for a in state.anomalies if a.event_id == intent.event_id]
    return f"the log recorded its intent as {kinds[0] if kinds else 'not this attempt'}"

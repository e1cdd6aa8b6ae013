"""Reading a claim back: the one ownership check before every effect, whoever makes it.

A claim is the event written right before an effect that only one writer may make: a
runner's intent (``step_intended``), a compensation's intent (``compensation_intended``,
by a runner's saga, a resolver settling for a runner, or the recovery daemon).  The writer
waits for the claim's acknowledgement, reads the workflow back through it in log order
and makes the effect only if the log's fold took the claim as a decision
(:func:`read_back`).  The fold is a left fold, so whether it takes a claim depends only on
what lies before the claim in the partition: a claim before any newer claim of the
workflow stands for good, and whoever claims the workflow after it reads it and settles
it instead of running past it.

What the fold may say instead (:class:`Standing`):

- ``fenced``: a runner's claim written under a claim of the workflow that a newer (or
  competing) one before it fenced off (``zombie_intent``, ``zombie_compensation``): the
  runner lost the workflow and raises :class:`~stepledger.errors.WorkflowTakenOverError`;
- ``lost``: another decision on the step came first (an outcome, another compensation):
  a resolver goes on with the log's decision; a runner's step call is refused as above;
- ``unknown``: the claim could not be read back in time: nothing is called and the step
  stays in doubt for its policy to settle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stepledger.domain import events as ev
from stepledger.domain.state import FENCED_OFF, WorkflowState, replay
from stepledger.errors import WorkflowTakenOverError
from stepledger.kafka import Position


class ClaimCheck(Protocol):
    """Reads a claim back: the workflow as the log has it through the claim, or None."""

    def __call__(self, claim: ev.Event, position: Position) -> WorkflowState | None:
        """Fold the workflow's events up to (at least) the claim; None when unknown in time."""
        ...


def reader_check(read: Callable[[str], list[ev.Event]]) -> ClaimCheck:
    """A ClaimCheck that reads the whole workflow again (the claim is acknowledged, so in it)."""

    def check(claim: ev.Event, position: Position) -> WorkflowState | None:
        return replay(claim.workflow_id, read(claim.workflow_id))

    return check


class Standing(enum.Enum):
    """What the log's fold made of a claim read back."""

    STANDS = "stands"
    """The fold took it as the step's decision: the effect may be made."""
    FENCED = "fenced"
    """A runner's claim under a claim of the workflow a newer or competing one fenced off."""
    LOST = "lost"
    """Another decision on the step came first: the claim is an anomaly."""
    UNKNOWN = "unknown"
    """Not read back in time: nothing may be called."""


@dataclass(frozen=True, slots=True)
class ReadBack:
    """A claim read back: how it stands, the workflow as the log has it, the anomaly if any."""

    standing: Standing
    state: WorkflowState | None
    """The fold of what was read (None when nothing could be read)."""
    anomaly: str | None = None
    """The anomaly kind the fold recorded the claim as (``fenced`` and ``lost``)."""


def read_back(confirm: ClaimCheck, claim: ev.Event, position: Position) -> ReadBack:
    """Read an acknowledged claim back through ``confirm`` and say how the log took it.

    The one check every effect goes through: runners' step calls and saga compensations
    (:func:`stepledger.producer.fence.ensure_owner`) and every resolver's compensation
    claim (the recovery daemon's and a resolver settling for a runner).
    """
    state = confirm(claim, position)
    if state is None or claim.event_id not in state.seen:
        return ReadBack(Standing.UNKNOWN, state)
    kinds = [a.kind for a in state.anomalies if a.event_id == claim.event_id]
    if not kinds:
        return ReadBack(Standing.STANDS, state)
    standing = Standing.FENCED if kinds[0] in FENCED_OFF else Standing.LOST
    return ReadBack(standing, state, kinds[0])


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

"""Matching a step call against the log (pure): what the SDK does when an agent asks for it.

Steps are matched by their identity (``step_id``).  A replayed plan that asks for another
step at a recorded position, or for a recorded step with another tool or other arguments,
is a mismatch, reported rather than silently matched.  A matched step with a recorded
outcome is replayed without calling the tool; one in doubt is settled first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from stepledger.domain.enums import EffectClass
from stepledger.domain.state import StepState, StepStatus, WorkflowState
from stepledger.domain.tools import Tool


class MoveKind(StrEnum):
    """What the SDK does with one step call."""

    RUN = "run"
    """Record an intent (at ``Move.attempt``) and call the tool."""
    REPLAY = "replay"
    """Return the recorded result; the tool is not called."""
    RAISE_FAILED = "raise_failed"
    """Raise the recorded failure (the first call of a failed step in this run)."""
    SETTLE = "settle"
    """The step is in doubt (or a compensation is running): resolve it first."""
    RERUN = "rerun"
    """A read-only step in doubt: call it again under its recorded intent (nothing to resolve)."""
    REQUEST_APPROVAL = "request_approval"
    """A pivot step with no approval requested yet: request it."""
    AWAIT_APPROVAL = "await_approval"
    """The approval was requested and not decided yet."""
    DENIED = "denied"
    """A human denied the step."""
    ESCALATED = "escalated"
    """The step waits for a human's verdict."""
    ESCALATE_FAILURE = "escalate_failure"
    """A definite failure after the pivot of a step that cannot be repeated safely, not yet
    escalated: its escalation is recorded, then the step waits for a person (ESCALATED)."""
    UNDONE = "undone"
    """The step was compensated (or its compensation failed): it cannot run again."""


@dataclass(frozen=True)
class Move:
    """The decision for one step call."""

    kind: MoveKind
    step: StepState | None = None
    """The step as the log tells it (None for a step never seen)."""
    attempt: int = 1
    """For RUN: the attempt the new intent records."""
    sequence: int = 0
    """For RUN: the position the new intent records."""
    key: str | None = None
    """For RUN: the idempotency key an earlier attempt used and the new one keeps, if any."""


def steps_by_position(state: WorkflowState) -> dict[int, list[str]]:
    """The state's step ids by recorded position, for many :func:`mismatch` checks on it."""
    positions: dict[int, list[str]] = {}
    for step in state.steps.values():
        positions.setdefault(step.sequence, []).append(step.step_id)
    return positions


def mismatch(
    state: WorkflowState,
    step_id: str,
    tool: str,
    arguments_digest: str,
    position: int,
    positions: Mapping[int, list[str]] | None = None,
    *,
    legacy: Callable[[], str] | None = None,
    shown: Callable[[], str] | None = None,
) -> str | None:
    """Why this call does not match the log at this position, or None when it matches.

    ``arguments_digest`` is the call's fingerprint (:mod:`stepledger.domain.fingerprint`);
    ``legacy`` gives the digest an intent written before fingerprints would hold, and
    ``shown`` the call's arguments as an intent records them (to name both calls).
    ``positions`` (:func:`steps_by_position` of this state) makes the check O(1): a replay
    checks every recorded step, and a scan of the steps per check made it quadratic.
    """
    if positions is None:
        positions = steps_by_position(state)
    at_position = next(
        (state.steps[other] for other in positions.get(position, ()) if other != step_id), None
    )
    if at_position is not None:
        return (
            f"at position {position} the log recorded step {at_position.step_id!r} "
            f"({at_position.tool}), the plan now asks for {step_id!r} ({tool})"
        )
    known = state.steps.get(step_id)
    if known is None:
        return None
    if known.sequence >= 0 and known.sequence != position:
        return (
            f"step {step_id!r} was recorded at position {known.sequence}, "
            f"the plan now asks for it at position {position}"
        )
    if known.tool and known.tool != tool:
        return (
            f"step {step_id!r} was recorded with tool {known.tool!r}, the plan now calls {tool!r}"
        )
    if known.attempt > 0 and not same_call(known, arguments_digest, legacy):
        now = _cut(shown()) if shown is not None else f"digest {arguments_digest[:12]}"
        return (
            f"step {step_id!r} was recorded as another call: {tool}"
            f"({_cut(known.arguments_json or '')}) (digest {known.arguments_digest[:12]}), the "
            f"plan now calls {tool}({now}) (digest {arguments_digest[:12]}): an argument that "
            "identifies the call differs (a tool names those in identity_args)"
        )
    return None


def mismatch_versions(
    state: WorkflowState, step_id: str, position: int, positions: Mapping[int, list[str]], now: str
) -> str:
    """Which code recorded the step a plan now contradicts, and which code asks (both named).

    ``now`` is this runner's versions in words; the recorded step's are those of the claim
    its intent was written under (the newest claim's when the intent names none).
    """
    recorded = state.steps.get(step_id)
    if recorded is None or recorded.attempt == 0:
        recorded = next((state.steps[o] for o in positions.get(position, ()) if o != step_id), None)
    epoch = recorded.epoch if recorded is not None and recorded.epoch else 0
    if not epoch:
        epoch = max((a for a in state.versions if a < state.attempt), default=state.attempt)
    return f"the log's step was recorded by {state.version_of(epoch)}, this run is {now}"


def same_call(known: StepState, fingerprint: str, legacy: Callable[[], str] | None = None) -> bool:
    """True when a recorded step's intent is this call (its fingerprint, or an older digest)."""
    if known.arguments_digest == fingerprint:
        return True
    return legacy is not None and known.arguments_digest == legacy()


def occurrences(state: WorkflowState, tool: str) -> list[StepState]:
    """The recorded steps of a tool, in the order they were first asked for.

    By position; a step asked for but not yet intended (an approval requested) has none
    and is the newest: nothing of the workflow runs past a step awaiting its approval.
    """
    steps = [s for s in state.steps.values() if s.tool == tool]
    return sorted(steps, key=lambda s: (s.sequence < 0, s.sequence, s.step_id))


def _cut(text: str, limit: int = 200) -> str:
    """A recorded argument text short enough for a one-line error."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def next_move(
    state: WorkflowState, step_id: str, tool: Tool, *, position: int, replaying: bool
) -> Move:
    """Decide what a call of ``step_id`` does, given the log.

    ``replaying`` is True for the first call of the step in this run of the agent: a
    recorded failure is then raised again, as the first run saw it; a later call of the
    same step in the same run asks for a retry.
    """
    step = state.steps.get(step_id)
    if step is None:
        if tool.requires_approval:
            return Move(MoveKind.REQUEST_APPROVAL)
        return Move(MoveKind.RUN, attempt=1, sequence=position)
    status = step.status
    if status is StepStatus.SUCCEEDED:
        return Move(MoveKind.REPLAY, step)
    if step.escalation_open or status is StepStatus.ABANDONED:
        return Move(MoveKind.ESCALATED, step)
    if status is StepStatus.INTENDED and step.effect is EffectClass.READ_ONLY:
        return Move(MoveKind.RERUN, step)
    fixed = _FIXED.get(status)
    if fixed is not None:
        return Move(fixed, step)
    if stranded(step):
        return Move(MoveKind.ESCALATE_FAILURE, step)
    if status is StepStatus.FAILED and replaying:
        return Move(MoveKind.RAISE_FAILED, step)
    # Failed and asked again, not happened, or approved: a new attempt.  Only a recorded,
    # definite failure moves it to a new key (invariant 17): after a "not happened" a late
    # call of the earlier attempt must collide with the retry at the service.
    sequence = step.sequence if step.sequence >= 0 else position
    key = step.idempotency_key if status is StepStatus.NOT_HAPPENED else None
    return Move(MoveKind.RUN, step, attempt=step.attempt + 1, sequence=sequence, key=key or None)


def stranded(step: StepState) -> bool:
    """True when a step failed after the pivot, cannot be repeated safely and no person has it.

    The saga cannot go back past its pivot and the step may not run again on its own (it is
    neither keyed nor idempotent), so a person decides: ``--not-happened`` lets it run
    again, ``--happened`` takes it as done.  Once escalated it is ``escalation_open``; once
    answered it is no longer failed.
    """
    return (
        step.status is StepStatus.FAILED
        and step.after_pivot
        and not step.repeatable
        and not step.escalation_open
    )


_FIXED = {
    StepStatus.INTENDED: MoveKind.SETTLE,
    StepStatus.COMPENSATING: MoveKind.SETTLE,
    StepStatus.COMPENSATED: MoveKind.UNDONE,
    StepStatus.COMPENSATION_FAILED: MoveKind.UNDONE,
    StepStatus.AWAITING_APPROVAL: MoveKind.AWAIT_APPROVAL,
    StepStatus.DENIED: MoveKind.DENIED,
}

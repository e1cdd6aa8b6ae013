"""Restarting a workflow from a step as a new workflow (pure): the plan, and the new log's head.

One way only: a new workflow id linked to the old one (``workflow_started.restarted_from``
and ``restart_step``; the old one ends ``restarted`` naming the new id).  The steps before
the restart step replay the old workflow's recorded outcomes: their intent and outcome are
copied into the new workflow's log, under the keys the effects were made with (so a later
compensation in the new workflow undoes the very effect), and an agent asking for them
gets the recorded result without a call.  The steps from the restart step on run anew,
under the new workflow's keys.  Before that, every effect recorded at or after the restart
step must be gone: an undoable one is compensated first (through the old workflow's one
compensation path), an effect that cannot be undone, or whose outcome is unknown, refuses
the restart with the list.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.state import RunStatus, StepState, StepStatus, WorkflowState
from stepledger.errors import LedgerStateError

#: Old statuses a restart may leave behind it (the effect is gone, or never was).
_GONE = frozenset({StepStatus.COMPENSATED, StepStatus.NOT_HAPPENED, StepStatus.FAILED})


@dataclass(frozen=True)
class RestartPlan:
    """What a restart of ``old`` from ``step_id`` as ``new`` does, and what refuses it."""

    old: str
    new: str
    step_id: str
    replayed: tuple[StepState, ...]
    """The steps before the restart step: their outcomes are replayed, nothing is called."""
    undo: tuple[StepState, ...]
    """Effects at or after the restart step that are compensated first (newest first)."""
    standing: tuple[StepState, ...]
    """Effects at or after the restart step that cannot be undone or are unknown: refusals."""

    @property
    def refusal(self) -> str | None:
        """Why the restart is refused (the steps named), or None."""
        if not self.standing:
            return None
        names = ", ".join(f"{s.step_id} ({s.tool}, {_why(s)})" for s in self.standing)
        return (
            f"restart of {self.old!r} from {self.step_id!r} refused: effects at or after it "
            f"stand and cannot be undone first: {names}"
        )

    @property
    def digest(self) -> str:
        """What the plan does, as a short digest: a confirmation binds the plan it was shown."""
        shown = "\n".join([*self.lines(), self.refusal or ""])
        return hashlib.sha256(shown.encode()).hexdigest()[:32]

    def lines(self) -> list[str]:
        """The plan in words, one line each (printed before ``--yes``)."""
        replay = ", ".join(s.step_id for s in self.replayed) or "nothing"
        undo = ", ".join(f"{s.step_id} ({s.tool})" for s in self.undo) or "nothing"
        return [
            f"restart {self.old} from step {self.step_id} as {self.new}:",
            f"  replays the recorded outcomes of {replay} (no call)",
            f"  compensates first in {self.old}: {undo}",
            f"  runs {self.step_id} and what follows anew under {self.new}'s keys",
            f"  ends {self.old} restarted (as {self.new})",
        ]


def plan(state: WorkflowState, step_id: str, new: str) -> RestartPlan:
    """The plan to restart ``state``'s workflow from ``step_id`` as ``new``.

    Raises LedgerStateError when the step is not recorded, the workflow already ended
    restarted or compensated away, or a step before it did not succeed (a prefix that
    replays must be outcomes the agent saw).
    """
    old = state.workflow_id
    start = state.steps.get(step_id)
    if start is None or start.sequence < 0:
        known = ", ".join(s.step_id for s in state.ordered_steps()) or "none"
        raise LedgerStateError(f"workflow {old!r} recorded no step {step_id!r} (steps: {known})")
    if state.status is RunStatus.RESTARTED or new == old:
        raise LedgerStateError(
            f"workflow {old!r} already ended restarted (as {state.restarted_as})"
            if state.status is RunStatus.RESTARTED
            else f"the new workflow id must differ from {old!r}",
            workflow_id=old,
        )
    before = [s for s in state.ordered_steps() if 0 <= s.sequence < start.sequence]
    unfinished = [s for s in before if s.status is not StepStatus.SUCCEEDED]
    if unfinished:
        names = ", ".join(f"{s.step_id} ({s.status.value})" for s in unfinished)
        raise LedgerStateError(
            f"restart of {old!r} from {step_id!r}: the steps before it must have succeeded to "
            f"replay; not so: {names} (restart from the first of them)",
            workflow_id=old,
            step_id=unfinished[0].step_id,
        )
    after = [s for s in state.ordered_steps() if s.sequence >= start.sequence and s.effectful]
    undo = [s for s in reversed(after) if s.undoable and s.status is StepStatus.SUCCEEDED]
    standing = [s for s in after if s.status not in _GONE and s not in undo]
    return RestartPlan(old, new, step_id, tuple(before), tuple(undo), tuple(standing))


def _timeout(step: StepState) -> timedelta:
    if step.deadline is None or step.intended_at is None:
        return timedelta(0)
    return max(step.deadline - step.intended_at, timedelta(0))


def _why(step: StepState) -> str:
    if step.status is StepStatus.SUCCEEDED:
        return "happened, cannot be undone"
    if step.status is StepStatus.COMPENSATION_FAILED:
        return f"its compensation failed: {step.error}"
    return f"{step.status.value}: settle it first"


def replayed_events(
    state: WorkflowState, restart: RestartPlan, now: datetime
) -> list[tuple[str, ev.Body]]:
    """The prefix copied into the new workflow, (step id, body): an intent and an outcome each.

    The intents keep the keys their effects were made with and name no runner (epoch 0:
    no claim fences them); each keeps its timeout from ``now`` (an old deadline would make
    the copy look overdue to recovery before its outcome is read); the outcomes say the
    recorded result, as the old log has it.
    """
    bodies: list[tuple[str, ev.Body]] = []
    for step in restart.replayed:
        assert step.effect is not None and step.policy is not None and step.deadline is not None
        intent = ev.StepIntended(
            sequence=step.sequence,
            tool=step.tool,
            effect=step.effect,
            policy=step.policy,
            idempotency_key=step.idempotency_key,
            arguments_json=step.arguments_json,
            arguments_digest=step.arguments_digest,
            deadline=step.deadline,
            attempt=step.attempt,
            repeatable=step.repeatable,
            undoable=step.undoable,
            after_pivot=step.after_pivot,
        )
        outcome = ev.StepOutcome(
            status=OutcomeStatus.SUCCEEDED,
            result_json=step.result_json,
            result_type=step.result_type,
            source=step.resolved_by or Source.AGENT,
            attempt=step.attempt,
            evidence_json=json.dumps({"replayed_from": state.workflow_id}),
        )
        bodies += [(step.step_id, intent), (step.step_id, outcome)]
    return bodies

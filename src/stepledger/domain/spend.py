"""What a workflow's model turns cost, from its log: incurred once each, reused per replay.

Pure.  The same reading as the projection's ``model_calls`` (:mod:`stepledger.projector.costs`)
for one workflow's events, for the command line and the inbox, which read a workflow's
events rather than the projection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stepledger.domain import events as ev
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.domain.usage import TurnUsage, usage_of

MODEL_TOOL = "model"
"""The tool of a recorded model turn (``stepledger.wire.MODEL_STEP_TOOL``)."""


@dataclass(frozen=True, slots=True)
class Spend:
    """A workflow's model turns: incurred (asked) against reused (replayed, not spent)."""

    turns_incurred: int = 0
    tokens_incurred: int = 0
    cost_incurred: float | None = None
    turns_reused: int = 0
    tokens_reused: int = 0
    cost_reused: float | None = None

    def line(self) -> str:
        """The spend in one line, e.g. ``3 model turns, 660 tokens (2 reused, 330 tokens)``."""
        text = f"{self.turns_incurred} model turns, {self.tokens_incurred} tokens"
        if self.cost_incurred is not None:
            text += f", cost {self.cost_incurred:.6g}"
        if self.turns_reused:
            text += f" (reused on resume: {self.turns_reused} turns, {self.tokens_reused} tokens"
            text += "" if self.cost_reused is None else f", cost {self.cost_reused:.6g}"
            text += ")"
        return text


def spend_of(state: WorkflowState, events: Iterable[ev.Event]) -> Spend:
    """The workflow's spend: its recorded turns, and each ``model_turn_reused`` of them."""
    usage: dict[str, TurnUsage] = {}
    for step in state.steps.values():
        if step.tool == MODEL_TOOL and step.status is StepStatus.SUCCEEDED:
            found = usage_of(step.result_json)
            if found is not None:
                usage[step.step_id] = found
    reused = [
        usage[e.step_id]
        for e in events
        if isinstance(e.body, ev.ModelTurnReused) and e.step_id in usage
    ]
    incurred = list(usage.values())
    return Spend(
        turns_incurred=len(incurred),
        tokens_incurred=sum(u.tokens for u in incurred),
        cost_incurred=_cost(incurred),
        turns_reused=len(reused),
        tokens_reused=sum(u.tokens for u in reused),
        cost_reused=_cost(reused),
    )


def _cost(usages: list[TurnUsage]) -> float | None:
    costs = [u.cost for u in usages if u.cost is not None]
    return sum(costs) if costs else None

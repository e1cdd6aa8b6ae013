"""The agent's working context, rebuilt from the log alone (pure).

After a crash an agent needs to know what it already did, not what it said: the
conversation with the model is never stored by stepledger.  ``build_context`` turns the
replayed steps into a compact, ordered list of summaries (tool, arguments as recorded,
so secrets stay redacted, status, result); a hook may summarise or drop old steps so the
context fits a prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stepledger.domain.ids import loads_or_text
from stepledger.domain.state import StepStatus, WorkflowState


@dataclass(frozen=True)
class StepSummary:
    """One step as the agent needs to remember it."""

    sequence: int
    """The step's position in the workflow (-1 for a step that only awaits approval)."""
    step_id: str
    """The step's identity."""
    tool: str
    """The tool it called."""
    status: StepStatus
    """Where it stands."""
    arguments: dict[str, Any] | None
    """The arguments as the intent recorded them (secret fields redacted); None if dropped."""
    result: Any = None
    """The recorded result, when it succeeded."""
    error: str | None = None
    """The recorded error, when it failed."""
    attempt: int = 0
    """Which attempt the summary describes."""
    covers: int = 1
    """How many steps this summary stands for (more than one after summarising)."""


#: Rewrites the ordered summaries: summarise, drop or trim entries.
ContextHook = Callable[[list[StepSummary]], list[StepSummary]]


def step_summaries(state: WorkflowState) -> list[StepSummary]:
    """Every step of the workflow, in order, as a summary.

    A step that only awaits its approval has no position yet: it is listed last.
    """
    return [
        StepSummary(
            sequence=s.sequence,
            step_id=s.step_id,
            tool=s.tool,
            status=s.status,
            arguments=_object(s.arguments_json) if s.attempt > 0 else None,
            result=loads_or_text(s.result_json),
            error=s.error,
            attempt=s.attempt,
        )
        for s in sorted(state.ordered_steps(), key=lambda s: s.sequence < 0)
    ]


def build_context(state: WorkflowState, hook: ContextHook | None = None) -> list[StepSummary]:
    """The agent's working context: the ordered step summaries, passed through ``hook``."""
    summaries = step_summaries(state)
    return summaries if hook is None else hook(summaries)


def keep_last(count: int, *, keep_arguments: bool = True) -> ContextHook:
    """A hook keeping the newest ``count`` steps whole and folding older ones into one line."""
    if count < 0:
        raise ValueError("count must be >= 0")

    def hook(summaries: list[StepSummary]) -> list[StepSummary]:
        if len(summaries) <= count:
            kept = summaries
            folded: list[StepSummary] = []
        else:
            cut = len(summaries) - count
            folded, kept = [fold_steps(summaries[:cut])], summaries[cut:]
        if not keep_arguments:
            kept = [replace(s, arguments=None) for s in kept]
        return folded + kept

    return hook


def fold_steps(summaries: Sequence[StepSummary]) -> StepSummary:
    """One summary standing for several steps: their ids, tools and statuses, no payloads."""
    if not summaries:
        raise ValueError("nothing to fold")
    statuses: dict[str, int] = {}
    for s in summaries:
        statuses[s.status.value] = statuses.get(s.status.value, 0) + 1
    first, last = summaries[0], summaries[-1]
    return StepSummary(
        sequence=first.sequence,
        step_id=f"{first.step_id}..{last.step_id}",
        tool=",".join(dict.fromkeys(s.tool for s in summaries)),
        status=last.status,
        arguments=None,
        result={"statuses": statuses},
        covers=sum(s.covers for s in summaries),
    )


def render(summaries: Sequence[StepSummary]) -> str:
    """The summaries as compact text lines, e.g. to put in a prompt."""
    lines = []
    for s in summaries:
        parts = [f"{s.step_id} [{s.tool}] {s.status.value}"]
        if s.covers > 1:
            parts.append(f"({s.covers} steps)")
        if s.arguments is not None:
            parts.append("args=" + _compact(s.arguments))
        if s.result is not None:
            parts.append("result=" + _compact(s.result))
        if s.error:
            parts.append(f"error={s.error}")
        lines.append(" ".join(parts))
    return "\n".join(lines)


def _object(text: str) -> dict[str, Any]:
    loaded = loads_or_text(text)
    return loaded if isinstance(loaded, dict) else {"value": loaded}


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)

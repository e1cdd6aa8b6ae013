"""Saga ordering, pure: the pivot rules, checked on a plan before it runs and on each step.

A saga runs its compensatable steps first, then its pivot (an irreversible step: once it
happened nothing undoes it), then steps that can only go forward.  So:

- an irreversible step must not come before a compensatable one (``check_plan``), and at
  run time a compensatable step is refused once an irreversible one may have happened;
- an irreversible step is refused while a compensatable step's outcome is unknown or a
  compensation is running: if that step turns out to need undoing, the pivot already
  committed the workflow to it;
- ``compensation_plan`` lists what ``compensate()`` undoes (completed compensatable steps,
  newest first) and refuses while any effectful step's outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from stepledger.domain.enums import EffectClass
from stepledger.domain.state import StepState, StepStatus, WorkflowState
from stepledger.domain.tools import Tool
from stepledger.errors import SagaViolationError


class ViolationKind(StrEnum):
    """Why a plan or a step breaks the saga rules."""

    IRREVERSIBLE_BEFORE_COMPENSATABLE = "irreversible_before_compensatable"
    """An irreversible step comes before compensatable ones."""
    PIVOT_PASSED = "pivot_passed"
    """A compensatable step after an irreversible step that may have happened."""
    UNRESOLVED_BEFORE_PIVOT = "unresolved_before_pivot"
    """An irreversible step while a compensatable step is in doubt or being compensated."""
    MISSING_APPROVAL = "missing_approval"
    """An irreversible tool without the approval the rules require."""
    DUPLICATE_STEP = "duplicate_step"
    """The same step id twice in one plan."""
    EFFECT_IN_READ_ONLY = "effect_in_read_only"
    """An effectful tool in a workflow declared read-only."""


@dataclass(frozen=True)
class PlanStep:
    """One step of a plan: its identity and the tool it calls."""

    step_id: str
    tool: Tool


@dataclass(frozen=True)
class Violation:
    """One broken rule, with the steps that cause it."""

    kind: ViolationKind
    step_id: str
    detail: str
    outstanding: tuple[str, ...] = ()
    """The other steps involved (e.g. the compensatable steps still in doubt)."""

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


@dataclass(frozen=True)
class PlanRules:
    """What ``check_plan`` enforces besides the pivot order."""

    irreversible_needs_approval: bool = False
    """Every irreversible tool in the plan must be declared ``requires_approval``."""
    read_only: bool = False
    """The workflow is declared read-only: every tool must be read-only."""


#: Compensatable steps in these states block a pivot: their effect is unknown or being undone.
UNRESOLVED = frozenset(
    {
        StepStatus.INTENDED,
        StepStatus.COMPENSATING,
        StepStatus.ABANDONED,
        StepStatus.COMPENSATION_FAILED,
    }
)
_SAGA_EFFECTS = frozenset({EffectClass.IRREVERSIBLE, EffectClass.COMPENSATABLE})
#: An irreversible step in these states may have happened: the pivot is passed.
MAY_HAVE_HAPPENED = frozenset({StepStatus.INTENDED, StepStatus.SUCCEEDED, StepStatus.ABANDONED})


def check_plan(
    steps: Iterable[PlanStep | tuple[str, Tool]], rules: PlanRules | None = None
) -> list[Violation]:
    """Every violation of the saga rules in a plan (empty when it may run as it is)."""
    plan = [s if isinstance(s, PlanStep) else PlanStep(*s) for s in steps]
    rules = rules or PlanRules()
    found = _duplicates(plan)
    for index, step in enumerate(plan):
        found.extend(_step_rules(step, plan[index + 1 :], rules))
    return found


def ensure_plan(
    steps: Iterable[PlanStep | tuple[str, Tool]],
    rules: PlanRules | None = None,
    *,
    workflow_id: str | None = None,
) -> None:
    """Raise SagaViolationError naming every violation of the plan, if it has any."""
    raise_violations(check_plan(steps, rules), workflow_id=workflow_id)


def step_violations(state: WorkflowState, step_id: str, tool: Tool) -> list[Violation]:
    """The violations running ``tool`` as ``step_id`` now would commit, given the log."""
    found: list[Violation] = []
    if tool.effect not in _SAGA_EFFECTS and not state.read_only:
        return found  # the common case, kept free of a pass over every step
    others = [s for s in state.ordered_steps() if s.step_id != step_id]
    if state.read_only and not tool.read_only:
        detail = f"workflow is read-only, tool {tool.name!r} is {tool.effect.value}"
        found.append(Violation(ViolationKind.EFFECT_IN_READ_ONLY, step_id, detail))
    if tool.effect is EffectClass.IRREVERSIBLE:
        blocking = [s for s in others if _compensatable(s) and _unresolved(s)]
        if blocking:
            names = ", ".join(f"{s.step_id} ({s.status.value})" for s in blocking)
            detail = f"irreversible {tool.name!r} refused while unresolved: {names}"
            found.append(_with(ViolationKind.UNRESOLVED_BEFORE_PIVOT, step_id, detail, blocking))
    if tool.effect is EffectClass.COMPENSATABLE:
        pivots = [s for s in others if _irreversible(s) and s.status in MAY_HAVE_HAPPENED]
        if pivots:
            names = ", ".join(s.step_id for s in pivots)
            detail = f"compensatable {tool.name!r} after the irreversible step(s) {names}"
            found.append(_with(ViolationKind.PIVOT_PASSED, step_id, detail, pivots))
    return found


def ensure_step(state: WorkflowState, step_id: str, tool: Tool) -> None:
    """Raise SagaViolationError if running ``tool`` as ``step_id`` now breaks the rules."""
    raise_violations(step_violations(state, step_id, tool), workflow_id=state.workflow_id)


def compensation_plan(state: WorkflowState) -> tuple[list[StepState], list[StepState]]:
    """What compensate() undoes, newest first, and the steps whose unknown outcome blocks it.

    A compensation already running is carried through; an effectful step in doubt, in the
    human queue or whose compensation failed blocks everything, because whether to undo
    around it depends on it.
    """
    steps = state.ordered_steps()
    blockers = [s for s in steps if s.effect is not EffectClass.READ_ONLY and _unknown(s)]
    undo = [
        s
        for s in reversed(steps)
        if _compensatable(s) and s.status in (StepStatus.SUCCEEDED, StepStatus.COMPENSATING)
    ]
    return undo, blockers


def raise_violations(found: Sequence[Violation], *, workflow_id: str | None = None) -> None:
    """Raise one SagaViolationError listing every violation, naming the outstanding steps."""
    if not found:
        return
    outstanding = tuple(dict.fromkeys(o for v in found for o in (v.outstanding or (v.step_id,))))
    message = "; ".join(str(v) for v in found)
    raise SagaViolationError(
        message, outstanding=outstanding, workflow_id=workflow_id, step_id=found[0].step_id
    )


def _step_rules(step: PlanStep, later: list[PlanStep], rules: PlanRules) -> list[Violation]:
    tool, found = step.tool, []
    if rules.read_only and not tool.read_only:
        detail = f"{step.step_id}: tool {tool.name!r} is {tool.effect.value} in a read-only plan"
        found.append(Violation(ViolationKind.EFFECT_IN_READ_ONLY, step.step_id, detail))
    if tool.effect is not EffectClass.IRREVERSIBLE:
        return found
    after = tuple(s.step_id for s in later if s.tool.effect is EffectClass.COMPENSATABLE)
    if after:
        detail = (
            f"irreversible {step.step_id} ({tool.name}) comes before compensatable "
            f"{', '.join(after)}: move it after them"
        )
        found.append(
            Violation(ViolationKind.IRREVERSIBLE_BEFORE_COMPENSATABLE, step.step_id, detail, after)
        )
    if rules.irreversible_needs_approval and not tool.requires_approval:
        detail = f"irreversible {step.step_id} ({tool.name}) has no approval gate"
        found.append(Violation(ViolationKind.MISSING_APPROVAL, step.step_id, detail))
    return found


def _duplicates(plan: list[PlanStep]) -> list[Violation]:
    seen: set[str] = set()
    found = []
    for step in plan:
        if step.step_id in seen:
            detail = f"step id {step.step_id!r} appears more than once"
            found.append(Violation(ViolationKind.DUPLICATE_STEP, step.step_id, detail))
        seen.add(step.step_id)
    return found


def _with(kind: ViolationKind, step_id: str, detail: str, steps: list[StepState]) -> Violation:
    return Violation(kind, step_id, detail, tuple(s.step_id for s in steps))


def _compensatable(step: StepState) -> bool:
    return step.effect is EffectClass.COMPENSATABLE


def _irreversible(step: StepState) -> bool:
    return step.effect is EffectClass.IRREVERSIBLE


def _unresolved(step: StepState) -> bool:
    return step.status in UNRESOLVED or step.escalation_open


def _unknown(step: StepState) -> bool:
    # A failed compensation is for a human too: the fold takes no second compensation.
    unknown = {StepStatus.INTENDED, StepStatus.ABANDONED, StepStatus.COMPENSATION_FAILED}
    return step.status in unknown or step.escalation_open

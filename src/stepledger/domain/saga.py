"""Saga ordering, pure: the pivot rules, checked on a plan before it runs and on each step.

A tool's effect has two properties: whether a repeat is safe (keyed, idempotent) and
whether it can be undone (a compensate hook).  The **pivot** of a saga is its first
effectful step that cannot be undone: once it happened, the saga can only go forward.  So:

- every undoable step comes before the pivot (``check_plan``; at run time an undoable step
  is refused once a pivot may have happened: ``pivot_passed``);
- a step after the pivot that cannot be repeated safely (an unkeyed receipt email after an
  irreversible charge) is allowed: it runs at most once, never again automatically, and
  when its outcome is in doubt or it fails a person decides.  ``check_plan`` reports it as
  a warning (:attr:`PlanCheck.warnings`), not a violation;
- a pivot is refused while an undoable step's outcome is unknown or a compensation is
  running: if that step turns out to need undoing, the pivot already committed to it;
- an approval can be required at the pivot (``PlanRules(pivot_needs_approval=True)``);
- ``compensation_plan`` lists what ``compensate()`` undoes (every undoable effect that
  happened, newest first) and refuses while any effectful step's outcome is unknown;
  ``left_standing`` lists what happened and was not undone, so a workflow ends
  ``compensated`` only when that list is empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from stepledger.domain.state import (
    StepState,
    StepStatus,
    WorkflowState,
)
from stepledger.domain.tools import Tool
from stepledger.errors import SagaViolationError


class ViolationKind(StrEnum):
    """Why a plan or a step breaks the saga rules."""

    UNDOABLE_AFTER_PIVOT = "undoable_after_pivot"
    """An undoable step comes after the pivot (in a plan)."""
    UNREPEATABLE_AFTER_PIVOT = "unrepeatable_after_pivot"
    """A step after the pivot cannot be repeated safely: a warning, never a violation.

    It runs at most once; an in-doubt call and a definite failure go to a person."""
    PIVOT_PASSED = "pivot_passed"
    """An undoable step after a pivot that may have happened (at run time)."""
    UNRESOLVED_BEFORE_PIVOT = "unresolved_before_pivot"
    """A pivot while an undoable step is in doubt or being compensated."""
    MISSING_APPROVAL = "missing_approval"
    """The pivot has no approval gate though the rules require one."""
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
    """The other steps involved (e.g. the undoable steps still in doubt)."""

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


class PlanCheck(list[Violation]):
    """What ``check_plan`` found: the violations (the list itself) and warnings beside them.

    A list, so ``check_plan(plan) == []`` still says "it may run as it is"; ``warnings``
    are what the author should know and may accept (a step after the pivot that runs at
    most once and goes to a person when it fails or its outcome is in doubt).
    """

    def __init__(
        self, violations: Iterable[Violation] = (), warnings: Iterable[Violation] = ()
    ) -> None:
        super().__init__(violations)
        self.warnings: tuple[Violation, ...] = tuple(warnings)
        """Findings that do not stop the plan, in plan order."""


@dataclass(frozen=True)
class PlanRules:
    """What ``check_plan`` enforces besides the pivot order."""

    pivot_needs_approval: bool = False
    """The plan's pivot (its first effect that cannot be undone) must require approval."""
    read_only: bool = False
    """The workflow is declared read-only: every tool must be read-only."""
    irreversible_needs_approval: bool = False
    """Older name of ``pivot_needs_approval`` (either one turns the rule on)."""

    @property
    def approval_at_pivot(self) -> bool:
        """True when the pivot must carry an approval gate."""
        return self.pivot_needs_approval or self.irreversible_needs_approval


def check_plan(
    steps: Iterable[PlanStep | tuple[str, Tool]], rules: PlanRules | None = None
) -> PlanCheck:
    """Every violation of the saga rules in a plan (empty when it may run as it is).

    Warnings (``.warnings`` of the answer) name what runs but needs a person when it goes
    wrong: each step after the pivot that cannot be repeated safely.
    """
    plan = [s if isinstance(s, PlanStep) else PlanStep(*s) for s in steps]
    rules = rules or PlanRules()
    found = _duplicates(plan)
    if rules.read_only:
        found.extend(_effects_in_read_only(plan))
    pivot = next((i for i, s in enumerate(plan) if s.tool.pivot), None)
    if pivot is None:
        return PlanCheck(found)
    found.extend(_pivot_rules(plan[pivot], plan[pivot + 1 :], rules))
    return PlanCheck(found, _unrepeatable_after(plan[pivot], plan[pivot + 1 :]))


def ensure_plan(
    steps: Iterable[PlanStep | tuple[str, Tool]],
    rules: PlanRules | None = None,
    *,
    workflow_id: str | None = None,
) -> tuple[Violation, ...]:
    """Raise SagaViolationError naming every violation of the plan; else return its warnings."""
    found = check_plan(steps, rules)
    raise_violations(found, workflow_id=workflow_id)
    return found.warnings


def pivot_passed(state: WorkflowState, step_id: str | None = None) -> list[StepState]:
    """The pivot steps (other than ``step_id``) that may have happened: the saga goes forward."""
    if not pivot_may_have_passed(state, step_id):
        return []
    return [s for s in state.ordered_steps() if s.step_id != step_id and s.pivot_happened]


def pivot_may_have_passed(state: WorkflowState, step_id: str | None = None) -> bool:
    """True when a pivot step other than ``step_id`` may have happened (O(1), per step call)."""
    own = state.steps.get(step_id) if step_id is not None else None
    return state.pivots_happened - (own is not None and own.pivot_happened) > 0


def _blocking(state: WorkflowState, step_id: str) -> list[StepState]:
    own = state.steps.get(step_id)
    if state.unresolved_undoable - (own is not None and own.unresolved_undoable) <= 0:
        return []
    return [s for s in state.ordered_steps() if s.step_id != step_id and s.unresolved_undoable]


def step_violations(state: WorkflowState, step_id: str, tool: Tool) -> list[Violation]:
    """The violations running ``tool`` as ``step_id`` now would commit, given the log.

    Checked on every step call, so it reads the fold's counts of pivots and unresolved
    undoable steps and passes over every step only to name the ones breaking a rule.  Each
    violation's detail ends with the fix.  A step after the pivot that cannot be repeated
    safely is no violation: it runs once, and a person decides when it fails or is in doubt.
    """
    found: list[Violation] = []
    if tool.read_only:
        return found  # the common case, kept free of a pass over every step
    if state.read_only:
        detail = (
            f"workflow is read-only, tool {tool.name!r} is {tool.effect_class.value}; fix: "
            "run effects in a workflow opened without read_only"
        )
        found.append(Violation(ViolationKind.EFFECT_IN_READ_ONLY, step_id, detail))
    blocking = _blocking(state, step_id) if tool.pivot else []
    if blocking:
        names = ", ".join(f"{s.step_id} ({s.status.value})" for s in blocking)
        detail = (
            f"{tool.name!r} cannot be undone; refused while unresolved: {names}; it runs once "
            "they are decided (recovery, or a person: `stepledger escalations list`)"
        )
        found.append(_with(ViolationKind.UNRESOLVED_BEFORE_PIVOT, step_id, detail, blocking))
    if not tool.undoable or not pivot_may_have_passed(state, step_id):
        return found
    pivots = pivot_passed(state, step_id)
    names = ", ".join(s.step_id for s in pivots)
    detail = (
        f"undoable {tool.name!r} after the pivot {names}: it could not be unwound; fix: call "
        "it before the pivot, or give it no compensate hook (a forward step)"
    )
    found.append(_with(ViolationKind.PIVOT_PASSED, step_id, detail, pivots))
    return found


def waits_only(found: Sequence[Violation]) -> bool:
    """True when every violation only waits for other steps to be decided (nothing to fix)."""
    return all(v.kind is ViolationKind.UNRESOLVED_BEFORE_PIVOT for v in found)


def compensation_plan(state: WorkflowState) -> tuple[list[StepState], list[StepState]]:
    """What compensate() undoes, newest first, and the steps whose unknown outcome blocks it.

    Every undoable effect that happened is undone (a compensation already running is
    carried through); an effectful step in doubt or in the human queue blocks everything,
    because whether to undo around it depends on it.
    """
    steps = state.ordered_steps()
    blockers = [s for s in steps if s.effectful and _unknown(s)]
    undo = [
        s
        for s in reversed(steps)
        if s.undoable and s.status in (StepStatus.SUCCEEDED, StepStatus.COMPENSATING)
    ]
    return undo, blockers


def left_standing(state: WorkflowState) -> list[StepState]:
    """Effects that happened and were not undone (cannot be, or their undo failed)."""
    return [
        s
        for s in state.ordered_steps()
        if s.effectful
        and (s.status is StepStatus.SUCCEEDED or s.status is StepStatus.COMPENSATION_FAILED)
    ]


def raise_violations(found: Sequence[Violation], *, workflow_id: str | None = None) -> None:
    """Raise one SagaViolationError listing every violation, naming the outstanding steps."""
    if not found:
        return
    outstanding = tuple(dict.fromkeys(o for v in found for o in (v.outstanding or (v.step_id,))))
    message = "; ".join(str(v) for v in found)
    raise SagaViolationError(
        message, outstanding=outstanding, workflow_id=workflow_id, step_id=found[0].step_id
    )


def _effects_in_read_only(plan: list[PlanStep]) -> list[Violation]:
    return [
        Violation(
            ViolationKind.EFFECT_IN_READ_ONLY,
            s.step_id,
            f"{s.step_id}: tool {s.tool.name!r} is {s.tool.effect_class.value} in a read-only plan",
        )
        for s in plan
        if not s.tool.read_only
    ]


def _pivot_rules(pivot: PlanStep, later: list[PlanStep], rules: PlanRules) -> list[Violation]:
    found = []
    where = f"{pivot.step_id} ({pivot.tool.name})"
    undoable = tuple(s.step_id for s in later if s.tool.undoable)
    if undoable:
        detail = (
            f"the pivot {where} cannot be undone and comes before undoable "
            f"{', '.join(undoable)}: move them before it"
        )
        found.append(Violation(ViolationKind.UNDOABLE_AFTER_PIVOT, pivot.step_id, detail, undoable))
    if rules.approval_at_pivot and not pivot.tool.requires_approval:
        detail = f"the pivot {where} has no approval gate"
        found.append(Violation(ViolationKind.MISSING_APPROVAL, pivot.step_id, detail))
    return found


def _unrepeatable_after(pivot: PlanStep, later: list[PlanStep]) -> list[Violation]:
    unsafe = tuple(s.step_id for s in later if s.tool.effectful and not s.tool.repeatable)
    if not unsafe:
        return []
    detail = (
        f"after the pivot {pivot.step_id} ({pivot.tool.name}), {', '.join(unsafe)} cannot be "
        "repeated safely (neither keyed nor idempotent): each runs at most once, and if its "
        "outcome is in doubt or it fails, a person decides (`stepledger escalations list`)"
    )
    return [Violation(ViolationKind.UNREPEATABLE_AFTER_PIVOT, pivot.step_id, detail, unsafe)]


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


def _unknown(step: StepState) -> bool:
    # A failed compensation is known: its effect stands (see left_standing) and goes to a human.
    unknown = {StepStatus.INTENDED, StepStatus.ABANDONED}
    return step.status in unknown or step.escalation_open

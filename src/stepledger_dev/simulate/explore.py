"""Many seeds: run each seed's plan, shrink what fails, and tell known defects from new ones.

A violation that matches a :data:`KNOWN_OPEN` entry is a defect already filed whose fix has
not landed on main; it is reported as such (with the entry's reason) and does not fail a
run.  Every entry names what removes it: once the fix lands, its entry goes, and from then
on the simulator fails on it like on anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from stepledger_dev.simulate.invariants import Violation
from stepledger_dev.simulate.plan import Plan, Profile, generate
from stepledger_dev.simulate.shrink import Shrunk, shrink
from stepledger_dev.simulate.world import Outcome, run


@dataclass(frozen=True)
class Known:
    """A defect on main the simulator finds, whose fix is pending."""

    invariant: str
    detail: str
    """A piece of the violation's detail that tells it apart (empty: any of the invariant)."""
    reason: str
    needs: Callable[[Plan], bool] | None = None
    """What a plan must hold to reach this defect (None: nothing): the same invariant
    broken by a plan without it is no known defect."""

    def matches(self, violation: Violation, plan: Plan) -> bool:
        """True when the violation is this defect."""
        if violation.invariant != self.invariant or self.detail not in violation.detail:
            return False
        return self.needs is None or self.needs(plan)


#: No defect the simulator finds is open on main now: each one it found is fixed and pinned
#: by its replay (``FIXED`` in tests/unit/test_simulate.py).
KNOWN_OPEN: tuple[Known, ...] = ()


def known(violation: Violation, plan: Plan) -> Known | None:
    """The known open defect this violation (of a run of ``plan``) is, if any."""
    return next((k for k in KNOWN_OPEN if k.matches(violation, plan)), None)


@dataclass
class Failure:
    """One failing seed: what it broke, its shrunk plan, and whether it is a known defect."""

    seed: int
    outcome: Outcome
    shrunk: Shrunk | None = None
    known: Known | None = None


@dataclass
class Report:
    """What a batch of seeds found."""

    seeds: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    @property
    def new(self) -> list[Failure]:
        """Failures that are no known open defect."""
        return [f for f in self.failures if f.known is None]

    @property
    def rate(self) -> float:
        """Seeds per second."""
        return self.seeds / self.seconds if self.seconds else 0.0


def explore(
    first: int,
    count: int,
    profile: Profile | None = None,
    *,
    turns: int | None = None,
    defects: tuple[str, ...] = (),
    shrinking: bool = True,
    on_failure: Callable[[Failure], None] | None = None,
) -> Report:
    """Run seeds ``first .. first + count - 1``; shrink every new failure."""
    report = Report()
    began = time.perf_counter()
    for seed in range(first, first + count):
        plan = plan_for(seed, profile, turns=turns, defects=defects)
        outcome = run(plan)
        report.seeds += 1
        if not outcome.failed:
            continue
        failure = Failure(seed, outcome, known=known(outcome.violations[0], outcome.plan))
        if shrinking and failure.known is None:
            failure.shrunk = shrink(outcome)
        report.failures.append(failure)
        if on_failure is not None:
            on_failure(failure)
    report.seconds = time.perf_counter() - began
    return report


def plan_for(
    seed: int,
    profile: Profile | None = None,
    *,
    turns: int | None = None,
    defects: tuple[str, ...] = (),
) -> Plan:
    """The plan a seed makes, with the run's turns and defect switches."""
    plan = generate(seed, profile)
    if turns is not None:
        plan = replace(plan, turns=turns)
    return replace(plan, defects=defects) if defects else plan


def first_found(
    count: int,
    profile: Profile | None = None,
    *,
    defects: tuple[str, ...] = (),
    invariant: str | None = None,
) -> Outcome | None:
    """The first of ``count`` seeds (from 1) that breaks an invariant (or that one)."""
    for seed in range(1, count + 1):
        outcome = run(plan_for(seed, profile, defects=defects))
        if outcome.failed and invariant in (None, outcome.violations[0].invariant):
            return outcome
    return None

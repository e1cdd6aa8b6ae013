"""Shrinking: a failing plan made small while it still breaks the same invariant.

Greedy, one change at a time, each tried by running the smaller plan under the same seed:
drop a fault, drop an actor (with the faults aimed at it), drop an agent's variant, set the
agents' clocks back to the broker's, fold the partitions into one, halve the turns.  A
change is kept when the run still breaks the invariant the original broke; the loop ends
when no change is kept or the run budget is spent.  The result replays exactly
(``stepledger simulate --seed S --schedule LINE``), and its trace, cut at the violation, is
the short story the test guarding the fix can tell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from stepledger_dev.simulate.plan import ActorSpec, Plan
from stepledger_dev.simulate.world import Outcome, run

#: Runs a shrink may spend at most.
BUDGET = 150


@dataclass(frozen=True)
class Shrunk:
    """The smallest failing plan found, its outcome, and how many runs it took."""

    plan: Plan
    outcome: Outcome
    runs: int


def shrink(
    outcome: Outcome, *, budget: int = BUDGET, runner: Callable[[Plan], Outcome] = run
) -> Shrunk:
    """Reduce a failing run's plan while it still breaks the same invariant."""
    if not outcome.failed:
        raise ValueError("only a failing run shrinks")
    invariant = outcome.violations[0].invariant
    best, best_outcome, runs = outcome.plan, outcome, 0
    improved = True
    while improved and runs < budget:
        improved = False
        for candidate in _smaller(best):
            if runs >= budget:
                break
            runs += 1
            tried = runner(candidate)
            if tried.failed and tried.violations[0].invariant == invariant:
                best, best_outcome, improved = candidate, tried, True
                break
    return Shrunk(best, best_outcome, runs)


def _smaller(plan: Plan) -> Iterator[Plan]:
    """Every plan one step smaller, the biggest cuts first."""
    for index in range(len(plan.faults)):
        yield plan.without_fault(index)
    for actor in plan.actors:
        yield plan.without_actor(actor.name)
    for actor in plan.actors:
        for option in actor.options:
            yield _without_option(plan, actor, option)
    if plan.agent_skew_ms:
        yield replace(plan, agent_skew_ms=0)
    if plan.partitions > 1:
        yield replace(plan, partitions=1)
    if plan.turns > 50:
        yield replace(plan, turns=plan.turns // 2)


def _without_option(plan: Plan, actor: ActorSpec, option: str) -> Plan:
    options = tuple(o for o in actor.options if o != option)
    actors = tuple(replace(a, options=options) if a is actor else a for a in plan.actors)
    return replace(plan, actors=actors)


def story(outcome: Outcome) -> list[str]:
    """The trace lines that tell the violation: its workflow's, the faults', who started."""
    workflow = outcome.violations[0].workflow
    marks = (f" {workflow}/", "FAULT", " starts", " ends:", "faults end")
    return [line for line in outcome.trace if not workflow or any(m in line for m in marks)]

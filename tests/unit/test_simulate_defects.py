"""The simulator re-finds each defect of the last two adversarial rounds when its fix is
reverted (a test-only switch puts the old behaviour back), within a stated number of seeds,
and finds none with the fix.

A defect found with its switch on is checked to be the switch's doing: the same schedule
with the switch off breaks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from stepledger_dev.simulate import explore, world
from stepledger_dev.simulate.plan import Profile


@dataclass(frozen=True)
class Case:
    """One defect: its switch, the plans that reach it, what breaks, within how many seeds."""

    switch: str
    profile: Profile
    invariant: str
    within: int


_PAUSES = ("freeze", "call_after")
CASES = {
    # A runner paused between its intent and its call wakes after recovery decided the step.
    "frozen_runner": Case(
        "frozen_runner",
        Profile(kinds=("trip", "framework"), faults=("freeze",), second_runners=0.0),
        "effect_under_open_intent",
        80,
    ),
    # A second runner resumes the workflow while the first is alive: both call.
    "two_live_runners": Case("two_live_runners", Profile(), "effect_under_open_intent", 20),
    # Agents' clocks behind the broker's: an intent's deadline passes early on the daemon's.
    "agent_clock_behind": Case(
        "agent_clock_deadline",
        Profile(
            kinds=("trip", "framework"),
            faults=("skew", *_PAUSES),
            fleet_skew_ms=2_000,
            fleet_chance=1.0,
            skew_sign=-1,
            second_runners=0.0,
        ),
        "no_early_decision",
        50,
    ),
    # Agents' clocks ahead of the broker's: recovery waits for their deadline, far too long.
    "agent_clock_ahead": Case(
        "agent_clock_ahead",
        Profile(
            kinds=("trip", "framework"),
            faults=("skew", *_PAUSES),
            fleet_skew_ms=120_000,
            fleet_chance=1.0,
            skew_sign=1,
            second_runners=0.0,
        ),
        "decided_within_bound",
        50,
    ),
    # A runner paused after its last step, before it cancels the trip, wakes after a second
    # runner took the workflow over (and finished it): it cancels the new owner's trip.
    "fenced_compensation": Case(
        "unfenced_compensation",
        Profile(
            kinds=("trip",),
            options=("cancel",),
            faults=("freeze",),
            windows=("outcome",),
            second_runners=1.0,
            second_start=(40, 300),
        ),
        "compensation_by_owner",
        30,
    ),
    # A resumed model words the charge's memo differently: a new step, a second charge.
    "reworded_model_call": Case(
        "worded_step",
        Profile(kinds=("framework",), options=("reword",), faults=("freeze", "kill", "call_after")),
        "effect_once",
        40,
    ),
    # A person approves a payment on card A; the resumed model pays with card B.
    "secret_approval": Case(
        "fixed_secret_mark",
        Profile(kinds=("framework",), options=("approval", "swap_card")),
        "approval_covers_call",
        40,
    ),
    # Another deployment's checkpointer writes into this log's checkpoint topic (0.3.0's
    # shared default; its log has the same name and workflow ids): after retention deleted
    # a partition's head, a reader completes a history from the other log's checkpoint.
    "shared_checkpoint_topic": Case(
        "unchecked_log_identity",
        Profile(shared_checkpoints=1.0, faults=("retention", "kill")),
        "log_isolation",
        20,
    ),
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_defect_is_found_when_its_fix_is_reverted(name: str) -> None:
    case = CASES[name]
    found = explore.first_found(
        case.within, case.profile, defects=(case.switch,), invariant=case.invariant
    )
    assert found is not None, f"{name}: no {case.invariant} within {case.within} seeds"
    print(f"{name}: found at seed {found.plan.seed}: {found.violations[0].line()}")
    fixed = world.run(replace(found.plan, defects=()))
    assert not fixed.failed, f"{name}: seed {found.plan.seed} fails with the fix too"


@pytest.mark.parametrize("name", sorted(CASES))
def test_none_is_found_with_the_fix(name: str) -> None:
    case = CASES[name]
    report = explore.explore(1, case.within, case.profile, shrinking=False)
    broken = [
        f"seed {f.seed}: {f.outcome.violations[0].line()}"
        for f in report.failures
        if f.outcome.violations[0].invariant == case.invariant or f.known is None
    ]
    assert not broken, "\n".join(broken)

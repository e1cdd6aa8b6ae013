"""Defects still open on main that the simulator found: each replay still breaks its
invariant and is reported as its ``explore.KNOWN_OPEN`` entry, not as a new violation.

When a fix lands, its replay breaks nothing and its case here fails: drop the case and the
KNOWN_OPEN entry (and move its variant out of ``plan.PENDING``), and the replay becomes the
fix's regression test.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from stepledger_dev.simulate import explore, plan, world

#: name -> (schedule, invariant, a piece of the KNOWN_OPEN entry's reason).
OPEN = {
    # A second runner whose clock runs 1.5 s ahead of the first's settles the first's
    # capture by the deadline the first wrote on its own clock: 404 ms early.
    "agents_clocks_apart": (
        '{"seed":48,"partitions":1,"actors":[["a1","paynotify","w1",0,[]],'
        '["a1b","paynotify","w1",46,[]],["recovery","recovery","",0,[]]],'
        '"faults":[[-1,"kill","a1",100],[0,"skew","a1",-1512]],"turns":75,"defects":[]}',
        "no_early_decision",
        "a resuming agent",
    ),
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", sorted(OPEN))
def test_an_open_defect_still_breaks_its_invariant_and_is_reported_as_known(name: str) -> None:
    line, invariant, reason = OPEN[name]
    outcome = world.run(plan.Plan.decode(line))
    assert outcome.failed, f"{name} no longer reproduces: fixed? drop it and its KNOWN_OPEN entry"
    violation = outcome.violations[0]
    assert violation.invariant == invariant, violation.line()
    entry = explore.known(violation, outcome.plan)
    assert entry is not None and reason in entry.reason, violation.line()

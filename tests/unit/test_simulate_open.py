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

#: name -> (schedule, invariant, a piece of the KNOWN_OPEN entry's reason); none open now
#: (the resuming agent's skew moved to ``FIXED`` in test_simulate.py).
OPEN: dict[str, tuple[str, str, str]] = {}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def test_every_known_open_entry_and_pending_variant_has_its_case_here() -> None:
    # With no case, a known-open entry or a pending variant would hide a defect unchecked.
    assert len(explore.KNOWN_OPEN) == len(OPEN)
    assert not plan.PENDING or OPEN


def test_each_open_defect_still_breaks_its_invariant_and_is_reported_as_known() -> None:
    for name, (line, invariant, reason) in sorted(OPEN.items()):
        outcome = world.run(plan.Plan.decode(line))
        assert outcome.failed, (
            f"{name} no longer reproduces: fixed? drop it and its KNOWN_OPEN entry"
        )
        violation = outcome.violations[0]
        assert violation.invariant == invariant, violation.line()
        entry = explore.known(violation, outcome.plan)
        assert entry is not None and reason in entry.reason, violation.line()

"""A young host for every test: ``time.monotonic`` reads about one second at the start.

The monotonic clock counts from boot, so a timer that starts at ``0.0`` ("never") waits out
its whole interval on a host booted less than an interval ago (issue 42: the recovery daemon's
first checkpoint waited an hour). Installed before anything of stepledger is imported, so a
``clock=time.monotonic`` default bound at import sees it too. The clock keeps its real rate
and stays monotonic; only its origin moves. ``STEPLEDGER_TEST_MONOTONIC_AT=off`` runs on the
host's own clock.
"""

from __future__ import annotations

import os
import sys
import time

START_S = 1.0
"""What ``time.monotonic()`` reads when the test process installs the young clock."""

_real = time.monotonic


def install() -> None:
    """Move ``time.monotonic``'s origin so it reads ``START_S`` (or the variable's value) now."""
    chosen = os.environ.get("STEPLEDGER_TEST_MONOTONIC_AT", "")
    if chosen == "off" or time.monotonic is not _real:
        return
    if any(name == "stepledger" or name.startswith("stepledger.") for name in sys.modules):
        raise RuntimeError("the young clock must be installed before stepledger is imported")
    start = float(chosen) if chosen else START_S
    offset = _real() - start

    def young() -> float:
        return _real() - offset

    time.monotonic = young


def installed() -> bool:
    """True once :func:`install` moved the clock."""
    return time.monotonic is not _real

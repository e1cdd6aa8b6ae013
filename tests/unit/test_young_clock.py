"""The test process runs on a young host's clock, so no timer may count on a long uptime."""

from __future__ import annotations

import time

from tests import young_clock


def test_the_monotonic_clock_reads_a_young_host() -> None:
    # Every tier runs on it (the root conftest installs it); a session longer than an hour
    # would read an hour, so the bound is the session's own length plus the start.
    assert young_clock.installed()
    assert time.monotonic() < young_clock.START_S + 3600

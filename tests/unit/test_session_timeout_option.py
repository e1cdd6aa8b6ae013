"""--session-timeout, one option of every daemon with a group: a duration or bare seconds."""

from __future__ import annotations

import click
import pytest

from stepledger.cli._common import Seconds


@pytest.mark.parametrize(("given", "seconds"), [("6", 6.0), ("6s", 6.0), ("1m", 60.0), (30, 30.0)])
def test_a_duration_or_bare_seconds_is_seconds(given: object, seconds: float) -> None:
    assert Seconds(1, 1800).convert(given, None, None) == seconds


@pytest.mark.parametrize("given", ["0.5", "31m", "1e400", "-6", "", "six"])
def test_past_the_range_or_not_a_duration_is_one_line(given: str) -> None:
    with pytest.raises(click.BadParameter) as refused:
        Seconds(1, 1800).convert(given, None, None)
    assert "\n" not in refused.value.format_message()

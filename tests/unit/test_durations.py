"""One parser for every duration a person types (CLI options, the inbox's age filter)."""

from __future__ import annotations

from datetime import timedelta

import click
import pytest

from stepledger.cli._recovery import parse_duration as cli_duration
from stepledger.domain.times import LONGEST, parse_duration
from stepledger.inbox.queue import parse_age


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), (" 15m ", 900), ("2h", 7200), ("7d", 604800), ("250ms", 0.25)],
)
def test_each_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert cli_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5 weeks", "1e3s", "5y"])
def test_anything_else_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)
    with pytest.raises(click.BadParameter):
        cli_duration(text)


def test_a_duration_that_would_overflow_is_refused_not_raised_as_overflow() -> None:
    # 99999999999 days overflows timedelta (an HTTP 500 in the inbox before).
    with pytest.raises(ValueError, match="longer than 36500 days"):
        parse_duration("99999999999d")
    with pytest.raises(ValueError, match="longer than"):
        parse_age("99999999999d")
    assert parse_duration(f"{LONGEST.days}d") == LONGEST


def test_the_inbox_age_filter_is_empty_for_no_text() -> None:
    assert parse_age("  ") is None
    assert parse_age("1h") == timedelta(hours=1)

"""Bounded time arithmetic: a deadline from the log can be anything a timestamp can hold.

An intent written with ``deadline = 9999-12-31T23:59:59.999Z`` is schema-valid; adding a
grace to it overflows ``datetime``.  Every sum of a recorded time and a duration goes through
:func:`later`, which saturates at the ends of the range instead of raising, so one event
can never stop the code that schedules it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

LATEST = datetime.max.replace(tzinfo=UTC)
"""The latest representable moment: "never" for scheduling purposes."""
EARLIEST = datetime.min.replace(tzinfo=UTC)
"""The earliest representable moment."""


def later(moment: datetime, delta: timedelta) -> datetime:
    """``moment + delta``, saturated at the ends of the representable range."""
    try:
        return moment + delta
    except OverflowError:
        return LATEST if delta > timedelta(0) else EARLIEST


def seconds(value: float) -> timedelta:
    """A duration of ``value`` seconds, saturated at ``timedelta``'s range (never raises)."""
    try:
        return timedelta(seconds=value)
    except OverflowError:
        return timedelta.max if value > 0 else timedelta.min


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
LONGEST = timedelta(days=36_500)
"""The longest duration a person can ask for (a hundred years): longer is a typo."""


def parse_duration(text: str) -> timedelta:
    """``250ms``, ``90`` (seconds), ``90s``, ``15m``, ``2h`` or ``7d`` as a timedelta.

    Raises ValueError, with the text, for anything else, including a duration longer than
    :data:`LONGEST` (``99999999999d`` would overflow ``timedelta``).
    """
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"expected a duration like 90s, 15m, 2h or 7d, got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if value > LONGEST.total_seconds():
        raise ValueError(f"{text.strip()!r} is longer than {LONGEST.days} days")
    return timedelta(seconds=value)

"""Bounded time arithmetic: a deadline from the log can be anything a timestamp can hold.

An intent written with ``deadline = 9999-12-31T23:59:59.999Z`` is schema-valid; adding a
grace to it overflows ``datetime``.  Every sum of a recorded time and a duration goes through
:func:`later`, which saturates at the ends of the range instead of raising, so one event
can never stop the code that schedules it.
"""

from __future__ import annotations

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

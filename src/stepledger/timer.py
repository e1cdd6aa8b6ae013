"""The process's monotonic clock and its sleeps: one small adapter the SDK waits through.

The wall clock is :data:`stepledger.domain.factory.Clock` (events are stamped with it);
this is the other clock a process has, the one that measures how long something took and
how long to wait.  The SDK reads it only through a :class:`Timer` (a runner's budget before
a call, settling's waits for a step to fall due), so a program that runs many "processes"
in one gives each its own: the deterministic simulator (``stepledger simulate``) runs every
actor on a timer of simulated time, and a paused actor's timer moves on as a real one does.
"""

from __future__ import annotations

import time
from typing import Protocol


class Timer(Protocol):
    """A monotonic clock (seconds, any origin) and a way to wait on it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (``time.monotonic``)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock (``time.sleep``)."""
        ...


class SystemTimer:
    """The process's own monotonic clock and ``time.sleep``."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``."""
        time.sleep(seconds)


#: The timer every SDK object uses unless it was given another.
SYSTEM_TIMER: Timer = SystemTimer()

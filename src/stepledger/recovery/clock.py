"""One clock for deadlines: when each event reached this daemon, on the daemon's own clock.

An intent records its deadline on the agent's wall clock (``occurred_at + timeout``), which
may run ahead of the daemon's or behind it: ahead, the recorded deadline would hold a
decision back by the skew (a liveness failure); behind, it would let the daemon decide while
the call is still in flight (a safety failure).  So the daemon never goes by the agent's
clock: the budget started before the intent was appended, which was before the daemon read
it, and the daemon measures when the record was appended on its own clock, never earlier
than it was:

- on a step log stamped by the broker (``message.timestamp.type=LogAppendTime``) from the
  record's broker time, taken to the daemon's clock with the smallest ``read time - broker
  time`` seen lately (an upper bound of the daemon's lead over the broker, since reading
  only adds delay: :class:`~stepledger.history.clock.AppendClock`, the one a resuming
  agent's history goes by too);
- otherwise the moment the daemon read the record.

Every wait of a step (its deadline plus the grace, a compensation's timeout, the back-off
after an attempt) then runs from that moment (``domain.resolution.Arrival``), its length
taken from the log: whatever the skew between machines, recovery never acts before the
deadline as the agent's own monotonic budget measured it, and acts within the deadline plus
the grace by the broker's clock.  The price without broker timestamps is that an intent
read late (a daemon catching up) waits its timeout again from the read.

The skew of each producer's clock against the daemon's (``occurred_at`` minus the arrival)
is measured on the way and exported; one line is logged per producer past a bound.  Only a
sure estimate counts: a producer ahead (reading late only makes a clock look behind), or
any record read promptly, while its partition was caught up.  A record read while catching
up (after a restart, a backlog) arrived late by however long it waited, and a broker-stamped
one is no better then, since every lead sample of the catch-up is late by as much: counting
it exported a producer minutes "behind" right after every restart.  Until a sure estimate
exists the skew is unknown (``None``, a NaN gauge), not zero.

"The daemon's clock" here is one that never steps (:class:`SteadyClock`): its wall clock
when first read, then moved on by its monotonic clock only.  Arrivals, the lead samples and
every comparison with a due time run on it, so a wall clock stepped forward (an NTP
correction, a VM resumed) neither anchors deadlines early nor makes due times pass at
once; the wall clock stays for the timestamps the daemon writes.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.factory import Clock
from stepledger.history.clock import LOG_APPEND_TIME, SAMPLES, AppendClock
from stepledger.timer import SYSTEM_TIMER, Timer

logger = logging.getLogger(__name__)

#: A producer whose clock is off by more than this is named in one log line.
SKEW_BOUND_S = 5.0

__all__ = ["LOG_APPEND_TIME", "SAMPLES", "SKEW_BOUND_S", "DeadlineClock", "SteadyClock"]


class SteadyClock:
    """A wall clock that never steps: the wall time when first read, then only the time a
    monotonic clock (a :class:`~stepledger.timer.Timer`) measured since."""

    def __init__(self, wall: Clock, timer: Timer = SYSTEM_TIMER) -> None:
        self.wall, self.timer = wall, timer
        self._anchor: tuple[datetime, float] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        """Now, on this clock (read from the daemon's loop and its workers alike)."""
        moment = self.timer.monotonic()
        with self._lock:
            if self._anchor is None:
                self._anchor = (self.wall(), moment)
            wall, start = self._anchor
        return wall + timedelta(seconds=moment - start)


class DeadlineClock(AppendClock):
    """Says when records were appended, on this daemon's clock, and measures producers' skew."""

    def __init__(self, bound_s: float = SKEW_BOUND_S) -> None:
        super().__init__()
        self.bound_s = bound_s
        self.skew: dict[str, float] = {}
        """Each producer's clock minus this daemon's (seconds, the latest sure estimate)."""
        self.warned: set[str] = set()

    def largest(self) -> float | None:
        """The producer skew of largest size (signed, seconds; None until one is sure)."""
        return max(self.skew.values(), key=abs, default=None)

    def measure(self, event: ev.Event, appended: datetime, prompt: bool) -> None:
        """Estimate the clock of the intent's producer against this daemon's from a record
        read ``prompt``-ly (its partition caught up) or not (one line past the bound, once
        per producer; an estimate that is not sure is dropped)."""
        producer = event.producer_id
        skew = (event.occurred_at - appended).total_seconds()
        # A late read looks like a producer behind, broker time or not: only a lead, or a
        # record read as it came, is sure.
        if not (prompt or skew > 0):
            return
        self.skew[producer] = skew
        if abs(skew) > self.bound_s and producer not in self.warned:
            self.warned.add(producer)
            logger.warning(
                "producer %s: clock %+.1fs off this daemon's; deadlines are re-anchored on "
                "this daemon's clock",
                producer,
                skew,
                extra={"producer_id": producer, "skew_s": round(skew, 3)},
            )

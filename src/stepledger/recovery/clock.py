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
  only adds delay);
- otherwise the moment the daemon read the record.

Every wait of a step (its deadline plus the grace, a compensation's timeout, the back-off
after an attempt) then runs from that moment (``domain.resolution.Arrival``), its length
taken from the log: whatever the skew between machines, recovery never acts before the
deadline as the agent's own monotonic budget measured it, and acts within the deadline plus
the grace by the broker's clock.  The price without broker timestamps is that an intent
read late (a daemon catching up) waits its timeout again from the read.

The skew of each producer's clock against the daemon's (``occurred_at`` minus the arrival)
is measured on the way and exported; one line is logged per producer past a bound.

"The daemon's clock" here is one that never steps (:class:`SteadyClock`): its wall clock
when first read, then moved on by its monotonic clock only.  Arrivals, the lead samples and
every comparison with a due time run on it, so a wall clock stepped forward (an NTP
correction, a VM resumed) neither anchors deadlines early nor makes due times pass at
once; the wall clock stays for the timestamps the daemon writes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.factory import Clock
from stepledger.timer import SYSTEM_TIMER, Timer

logger = logging.getLogger(__name__)

#: librdkafka's timestamp type of a record stamped by the broker (``TIMESTAMP_LOG_APPEND_TIME``).
LOG_APPEND_TIME = 2
#: How many recent ``read time - broker time`` samples the daemon's lead is the least of.
SAMPLES = 512
#: A producer whose clock is off by more than this is named in one log line.
SKEW_BOUND_S = 5.0


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


@dataclass
class DeadlineClock:
    """Says when records were appended, on this daemon's clock, and measures producers' skew."""

    bound_s: float = SKEW_BOUND_S
    skew: dict[str, float] = field(default_factory=dict)
    """Each producer's clock minus this daemon's (seconds, the latest estimate)."""
    warned: set[str] = field(default_factory=set)
    _least: deque[tuple[int, float]] = field(default_factory=deque)
    """Of the last ``SAMPLES`` ``read time - broker time`` samples (seconds, from
    broker-stamped records), those that may still become the least, increasing, with their
    serial numbers: the least of the window in O(1) per record."""
    _taken: int = 0

    def observe(self, timestamp: tuple[int, int], now: datetime) -> None:
        """Note one record read at ``now`` (a broker-stamped one teaches the daemon's lead)."""
        kind, millis = timestamp
        if kind == LOG_APPEND_TIME and millis > 0:
            sample = now.timestamp() - millis / 1000
            self._taken += 1
            while self._least and self._least[-1][1] >= sample:
                self._least.pop()
            self._least.append((self._taken, sample))
            while self._least[0][0] <= self._taken - SAMPLES:
                self._least.popleft()  # fell out of the window

    def least_lead(self) -> float | None:
        """The smallest recent ``read time - broker time`` (None before a stamped record)."""
        return self._least[0][1] if self._least else None

    def appended(self, timestamp: tuple[int, int], now: datetime) -> tuple[datetime, bool]:
        """When a record read at ``now`` was appended, on this daemon's clock (a later bound),
        and whether the broker stamped it (else the read time stands in)."""
        kind, millis = timestamp
        lead = self.least_lead()
        if kind != LOG_APPEND_TIME or millis <= 0 or lead is None:
            return now, False
        broker = datetime.fromtimestamp(millis / 1000, UTC)
        return min(now, broker + timedelta(seconds=lead)), True

    def largest(self) -> float:
        """The producer skew of largest size (signed, seconds; 0 when none is known)."""
        return max(self.skew.values(), key=abs, default=0.0)

    def measure(self, event: ev.Event, appended: datetime, stamped: bool) -> None:
        """Estimate the clock of the intent's producer against this daemon's (one line past
        the bound, once per producer)."""
        producer = event.producer_id
        skew = (event.occurred_at - appended).total_seconds()
        self.skew[producer] = skew
        # Without broker time a late read looks like a producer behind: only a lead is sure.
        sure = stamped or skew > 0
        if sure and abs(skew) > self.bound_s and producer not in self.warned:
            self.warned.add(producer)
            logger.warning(
                "producer %s: clock %+.1fs off this daemon's; deadlines are re-anchored on "
                "this daemon's clock",
                producer,
                skew,
                extra={"producer_id": producer, "skew_s": round(skew, 3)},
            )

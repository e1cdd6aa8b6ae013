"""One clock for deadlines: an intent's deadline re-anchored on the daemon's own clock.

An intent records its deadline on the agent's wall clock (``occurred_at + timeout``).  A
daemon whose clock runs ahead of the agent's would find that deadline passed while the
call is still in flight.  So the daemon never goes by the agent's clock alone: the budget
started before the intent was appended, which was before the daemon read it, so

- on a step log stamped by the broker (``message.timestamp.type=LogAppendTime``) the
  budget started no later than the record's broker time, taken to the daemon's clock with
  the smallest ``read time - broker time`` seen lately (an upper bound of the daemon's lead
  over the broker, since reading only adds delay);
- otherwise no later than the moment the daemon read the record.

The step falls due at the later of its recorded deadline and that anchor plus the timeout,
plus the grace: whatever the skew between machines, recovery never acts before the
deadline as the agent's own clock measured it.  The price without broker timestamps is
that an intent read late (a daemon catching up) waits its timeout again from the read.

The skew of each producer's clock against the daemon's (``occurred_at`` minus the anchor)
is measured on the way and exported; one line is logged per producer past a bound.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.times import later

logger = logging.getLogger(__name__)

#: librdkafka's timestamp type of a record stamped by the broker (``TIMESTAMP_LOG_APPEND_TIME``).
LOG_APPEND_TIME = 2
#: How many recent ``read time - broker time`` samples the daemon's lead is the least of.
SAMPLES = 512
#: A producer whose clock is off by more than this is named in one log line.
SKEW_BOUND_S = 5.0


@dataclass
class DeadlineClock:
    """Re-anchors intents' deadlines on this daemon's clock and measures producers' skew."""

    bound_s: float = SKEW_BOUND_S
    lead: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    """Recent ``read time - broker time`` samples (seconds), from broker-stamped records."""
    skew: dict[str, float] = field(default_factory=dict)
    """Each producer's clock minus this daemon's (seconds, the latest estimate)."""
    warned: set[str] = field(default_factory=set)

    def observe(self, timestamp: tuple[int, int], now: datetime) -> None:
        """Note one record read at ``now`` (a broker-stamped one teaches the daemon's lead)."""
        kind, millis = timestamp
        if kind == LOG_APPEND_TIME and millis > 0:
            self.lead.append(now.timestamp() - millis / 1000)

    def appended(self, timestamp: tuple[int, int], now: datetime) -> tuple[datetime, bool]:
        """When a record read at ``now`` was appended, on this daemon's clock (a later bound),
        and whether the broker stamped it (else the read time stands in)."""
        kind, millis = timestamp
        if kind != LOG_APPEND_TIME or millis <= 0 or not self.lead:
            return now, False
        broker = datetime.fromtimestamp(millis / 1000, UTC)
        return min(now, broker + timedelta(seconds=min(self.lead))), True

    def anchor(
        self, event: ev.Event, appended: datetime, stamped: bool, grace: timedelta
    ) -> datetime | None:
        """When an intent may fall due on this daemon's clock (None for other events)."""
        body = event.body
        if not isinstance(body, ev.StepIntended):
            return None
        self._measure(event, appended, stamped)
        timeout = body.deadline - event.occurred_at
        return later(later(appended, timeout), grace)

    def largest(self) -> float:
        """The producer skew of largest size (signed, seconds; 0 when none is known)."""
        return max(self.skew.values(), key=abs, default=0.0)

    def _measure(self, event: ev.Event, appended: datetime, stamped: bool) -> None:
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

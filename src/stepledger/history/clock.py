"""When records were appended, on the reader's own clock: the one clock for deadlines.

An intent records its deadline on its writer's wall clock, which may run ahead of a
reader's or behind it; behind, a reader going by it would decide while the call may still
be in flight.  So a reader never goes by the writer's clock: on a step log stamped by the
broker (``message.timestamp.type=LogAppendTime``) it takes each record's broker time to
its own clock with the smallest ``read time - broker time`` seen lately.  Reading only adds
delay, so that least is an upper bound of the reader's lead over the broker, and the
broker time plus it is never earlier than the append on the reader's clock: a wait
measured from there never ends before the writer's own budget did, whatever the skew
between the machines.  The freshest sample is the tightest: a record read right after it
landed (a resuming agent's own claim, read back) bounds the lead by about one round trip.

The recovery daemon (``recovery.clock.DeadlineClock``) and the history wing
(:class:`~stepledger.history.kafka.KafkaHistory`, so a resuming agent) both judge deadlines
with this class; a record the broker did not stamp has no time here.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

#: librdkafka's timestamp type of a record stamped by the broker (``TIMESTAMP_LOG_APPEND_TIME``).
LOG_APPEND_TIME = 2
#: How many recent ``read time - broker time`` samples the reader's lead is the least of.
SAMPLES = 512

Stamp = tuple[int, int]
"""A record's timestamp as the client gives it: ``(type, milliseconds)``."""


class AppendClock:
    """Says when records were appended, on this reader's clock (a later bound)."""

    def __init__(self) -> None:
        self._least: deque[tuple[int, float]] = deque()
        """Of the last ``SAMPLES`` ``read time - broker time`` samples (seconds, from
        broker-stamped records), those that may still become the least, increasing, with
        their serial numbers: the least of the window in O(1) per record."""
        self._taken = 0
        self._lock = threading.Lock()  # an SDK's workflows read from several threads

    def observe(self, timestamp: Stamp, now: datetime) -> None:
        """Note one record read at ``now`` (a broker-stamped one teaches the reader's lead)."""
        kind, millis = timestamp
        if kind != LOG_APPEND_TIME or millis <= 0:
            return
        sample = now.timestamp() - millis / 1000
        with self._lock:
            self._taken += 1
            least = self._least
            while least and least[-1][1] >= sample:
                least.pop()
            least.append((self._taken, sample))
            while least[0][0] <= self._taken - SAMPLES:
                least.popleft()  # fell out of the window

    def least_lead(self) -> float | None:
        """The smallest recent ``read time - broker time`` (None before a stamped record)."""
        with self._lock:
            return self._least[0][1] if self._least else None

    def appended(self, timestamp: Stamp, now: datetime) -> tuple[datetime, bool]:
        """When a record read at ``now`` was appended, on this reader's clock (a later
        bound), and whether the broker stamped it (else the read time stands in)."""
        kind, millis = timestamp
        lead = self.least_lead()
        if kind != LOG_APPEND_TIME or millis <= 0 or lead is None:
            return now, False
        broker = datetime.fromtimestamp(millis / 1000, UTC)
        return min(now, broker + timedelta(seconds=lead)), True

    def read(self, stamps: Iterable[tuple[str, Stamp]], now: datetime) -> dict[str, datetime]:
        """When each broker-stamped event of one read (its id and its record's stamp) was
        appended, on this reader's clock; every stamp is observed first, so the freshest
        record of the read bounds the lead for all of them."""
        stamped = [(event_id, stamp) for event_id, stamp in stamps if stamp[0] == LOG_APPEND_TIME]
        for _, stamp in stamped:
            self.observe(stamp, now)
        found: dict[str, datetime] = {}
        for event_id, stamp in stamped:
            at, broker = self.appended(stamp, now)
            if broker:
                found.setdefault(event_id, at)  # a duplicate's first append counts
        return found

"""One line when the broker is lost and one when it is back, instead of hundreds.

librdkafka reports a broker outage as a stream of connection errors (hundreds a minute per
client) and never says that the broker came back.  :class:`BrokerWatch` turns that into two
log lines per outage (``broker unreachable`` and ``broker reachable again after N s``) and a
gauge, and rate-limits librdkafka's own log lines through a Python logger.  The daemons ask
it whether to probe the broker (a cheap metadata request) while it is down.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

#: The error that means "no broker answers" (one connection failing is not an outage).
_OUTAGE = frozenset({KafkaError._ALL_BROKERS_DOWN})
#: Connection-level errors: noise during an outage, logged by librdkafka's rate-limited lines.
_CONNECTION = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._RESOLVE})


class BrokerWatch:
    """Tracks whether the broker answers; logs each change once, with the outage's length."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_every_s: float = 1.0,
    ) -> None:
        self.log = log
        self.on_change = on_change
        self.clock = clock
        self.probe_every_s = probe_every_s
        self.down_since: float | None = None
        self.outages = 0
        self._last_probe = -math.inf
        self._last_up = float("-inf")
        self._lock = threading.Lock()

    @property
    def up(self) -> bool:
        """False during an outage."""
        return self.down_since is None

    def on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb``: an outage starts at the first transport-level error."""
        if err.code() in _CONNECTION:
            return
        if err.code() not in _OUTAGE:
            self.log.warning("kafka client error", extra={"error": err.str()})
            return
        with self._lock:
            if self.down_since is not None:
                return
            if self.clock() - self._last_up < self.probe_every_s:
                return  # served late: raised before the broker answered again
            self.down_since = self.clock()
            self.outages += 1
        self.log.error("broker unreachable", extra={"error": err.str()})
        if self.on_change is not None:
            self.on_change(False)

    def reachable(self) -> None:
        """Something the broker answered came back: an outage (if any) is over."""
        with self._lock:
            since, self.down_since = self.down_since, None
            self._last_up = self.clock()
        if since is None:
            return
        self.log.warning(
            "broker reachable again after %.1fs",
            self.clock() - since,
            extra={"outage_s": round(self.clock() - since, 3)},
        )
        if self.on_change is not None:
            self.on_change(True)

    def should_probe(self) -> bool:
        """True (at most once per ``probe_every_s``) while the broker is down."""
        if self.down_since is None:
            return False
        now = self.clock()
        if now - self._last_probe < self.probe_every_s:
            return False
        self._last_probe = now
        return True


class RateLimit(logging.Filter):
    """Lets one record of a kind through per ``every_s`` seconds (librdkafka repeats itself)."""

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._seen: dict[tuple[int, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Pass the first record of its kind in a window, drop the repeats."""
        kind = (record.levelno, str(record.getMessage())[:48])
        now = self.clock()
        last = self._seen.get(kind)
        if last is not None and now - last < self.every_s:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[kind] = now
        return True


def client_logger(name: str) -> logging.Logger:
    """A logger for librdkafka's own lines, rate-limited (pass it as the ``logger`` setting)."""
    log = logging.getLogger(name)
    if not any(isinstance(f, RateLimit) for f in log.filters):
        log.addFilter(RateLimit())
    return log

"""Which client a durable record goes to: a prompt one, or under load a lingering one.

With ``linger.ms=0`` every record leaves as soon as it is produced, so a record produced
while others are in flight is a produce request of its own.  Under many concurrent agents
the broker then pays its whole per-request cost for about one record (measured on Apache
Kafka 4.4 with 64 asyncio agents: ~2 records a request, ~200 us of broker CPU per step,
against ~8 records a request and ~40 us for the raw client, whose records queue while it
waits).  A record produced while ``from_in_flight`` records of the process are already in
flight goes to a second client that lingers ``linger_ms`` for company instead; below that
load every record leaves at once, as before, so a lone agent's step waits for no linger.
Only records that may linger do (the producer's asyncio sends): a thread blocked on its own
record is never sent through the lingering client (:meth:`DurableProducer.queue`).

Each client keeps the order of what it sends (one idempotent producer), and nothing orders
records across two clients, so a key's records (a workflow's events) stay on one client
for as long as any of them is in flight.  Records sent one after another without waiting
(a pipelined outcome and the next intent) therefore still land in the order sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Batching:
    """When a record may wait for company, and for how long."""

    linger_ms: float = 1.0
    """How long a record produced under load may wait for others in its produce request."""
    from_in_flight: int = 8
    """Records of the process in flight (produced, not yet acknowledged) that make a load."""


#: Which client: the prompt one (linger 0) or the lingering one.
PROMPT, LINGERING = 0, 1


class Lanes:
    """Counts records in flight and gives each record its client (thread-safe)."""

    def __init__(self, batching: Batching) -> None:
        self.batching = batching
        self._lock = threading.Lock()
        self._in_flight = 0
        self._held: dict[tuple[str, bytes | int | None], list[int]] = {}
        """Per topic and key (or explicit partition): [client, records in flight]."""

    @property
    def in_flight(self) -> int:
        """Records produced through the lanes and not yet reported."""
        return self._in_flight

    def take(
        self,
        topic: str,
        key: bytes | None,
        partition: int | None,
        settle: Callable[[T], None],
        may_linger: bool = True,
    ) -> tuple[int, Callable[[T], None], Callable[[], None]]:
        """The client for one record, its ``settle`` that also counts it landed, and the
        call that forgets it instead when its produce is refused (exactly one of the two)."""
        held_by = (topic, key if partition is None else partition)
        with self._lock:
            held = self._held.get(held_by)
            if held is None:
                loaded = may_linger and self._in_flight >= self.batching.from_in_flight
                held = self._held[held_by] = [LINGERING if loaded else PROMPT, 0]
            held[1] += 1
            self._in_flight += 1

        def release() -> None:
            with self._lock:
                self._in_flight -= 1
                held[1] -= 1
                if held[1] <= 0 and self._held.get(held_by) is held:
                    del self._held[held_by]

        def landed(outcome: T) -> None:
            release()
            settle(outcome)

        return held[0], landed, release

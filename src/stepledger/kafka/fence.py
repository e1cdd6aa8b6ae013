"""Ownership of a consumer group's partitions, trusted only while the member polls regularly.

A member paused past its session timeout (SIGSTOP, a long GC, a frozen VM) has lost its
partitions to another member, but it wakes up with work in hand and nothing has told it
yet.  The group tells the consuming loop, and only when it polls: so ownership is trusted
only while the loop polls regularly.  A gap between two polls longer than the session
timeout makes every partition suspect until the group had time to answer (a few
heartbeats); a revoked or lost partition is dropped at once.  The recovery daemon appends
a decision (:mod:`stepledger.recovery.fence`), and the checkpointer writes a partition's
checkpoints and directory, only for a partition it owns by this rule.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from stepledger.errors import OwnershipLostError


class _Working(threading.local):
    """The partition the calling worker thread resolves a step of (None: none)."""

    partition: int | None = None


class Fence:
    """What the loop knows about ownership, readable from worker threads."""

    def __init__(
        self,
        session_s: float,
        heartbeat_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_s = session_s
        self.heartbeat_s = heartbeat_s
        self._clock = clock
        self._owned: set[int] = set()
        self._last_poll = clock()
        self._suspect_until = -math.inf
        self._lock = threading.Lock()
        self._current = _Working()

    def polled(self) -> None:
        """The loop polled the group: ownership is as the callbacks left it."""
        now = self._clock()
        with self._lock:
            if now - self._last_poll > self.session_s:
                # We were gone longer than the session: the group may have moved our
                # partitions and not told us yet; wait for its answer.
                self._suspect_until = now + max(1.0, 3 * self.heartbeat_s)
            self._last_poll = now

    def assigned(self, partitions: set[int]) -> None:
        """Partitions handed to this daemon."""
        with self._lock:
            self._owned |= partitions

    def revoked(self, partitions: set[int]) -> None:
        """Partitions taken away (revoked or lost)."""
        with self._lock:
            self._owned -= partitions

    def owns(self, partition: int) -> bool:
        """True while the partition is ours beyond reasonable doubt."""
        now = self._clock()
        with self._lock:
            return (
                partition in self._owned
                and now - self._last_poll < self.session_s
                and now >= self._suspect_until
            )

    def working_on(self, partition: int | None) -> None:
        """Set the partition the calling worker thread resolves a step of."""
        self._current.partition = partition

    def check(self) -> None:
        """Raise OwnershipLostError unless the calling worker's partition is still ours."""
        partition = self._current.partition
        if partition is not None and not self.owns(partition):
            raise OwnershipLostError(
                f"partition {partition} may have moved to another daemon: decision not appended"
            )

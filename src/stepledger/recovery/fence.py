"""Fencing: a daemon appends a decision only for a partition it is sure it still owns.

A daemon paused past its session timeout has lost its partitions, but its worker threads
wake up with queued and running resolutions and nothing has told them yet; ownership is
trusted by :class:`~stepledger.kafka.fence.Fence`'s rule.  Every append of a decision goes
through :class:`FencedLog`, which refuses with
:class:`~stepledger.errors.OwnershipLostError` (not counted as a failed attempt: the new
owner decides).  Compensations are also claimed and read back (``claims``), so a hook with an
effect never runs on a stale owner's word.
"""

from __future__ import annotations

from stepledger.domain.events import Event
from stepledger.kafka import Position
from stepledger.kafka.fence import Fence
from stepledger.log import Acknowledgement, EventLog


class FencedLog:
    """An EventLog that checks the fence before every append."""

    def __init__(self, log: EventLog, fence: Fence) -> None:
        self.log = log
        self.fence = fence

    def append(self, event: Event) -> Position:
        """Append if the worker's partition is still ours."""
        self.fence.check()
        return self.log.append(event)

    async def append_async(self, event: Event) -> Position:
        """Append (asyncio) if the worker's partition is still ours."""
        self.fence.check()
        return await self.log.append_async(event)

    def send(self, event: Event) -> Acknowledgement:
        """Queue an append if the worker's partition is still ours (checked before it leaves)."""
        self.fence.check()
        return self.log.send(event)

    def connect(self) -> None:
        """Start connecting the wrapped log."""
        self.log.connect()

    def close(self) -> None:
        """Close the wrapped log."""
        self.log.close()

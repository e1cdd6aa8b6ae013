"""The daemon's own decisions, read back without decoding them again.

Every event a resolution appends is read back by the daemon's consumer and folded at its
place in the log, like any other event (log order decides).  Its content is already known:
the broker acknowledged *that* record at *that* offset, so the record the consumer reads
there is the event the worker sent.  Decoding it again was a third of the loop's work in a
burst.  A record is taken as the sent event only when its partition, offset and event id
(the ``ce_id`` header) all match; anything else is decoded as usual.
"""

from __future__ import annotations

import threading

from stepledger import wire
from stepledger.domain.events import Event
from stepledger.kafka.records import Consumed
from stepledger.resolution.resolver import Resolution

#: Acknowledged events kept until read back; a partition revoked meanwhile leaves some
#: unread, so the oldest go first past this bound.
ECHOES_KEPT = 65_536


class Echoes:
    """Acknowledged events by where they landed (thread-safe: workers add, the loop takes)."""

    def __init__(self, topic: str, size: int = ECHOES_KEPT) -> None:
        self.topic = topic
        self.size = size
        self._landed: dict[tuple[int, int], Event] = {}
        self._lock = threading.Lock()

    def expect(self, resolution: Resolution) -> None:
        """Remember where each acknowledged event of a resolution landed."""
        with self._lock:
            for event, position in zip(resolution.events, resolution.positions, strict=False):
                if position.topic == self.topic:
                    self._landed[(position.partition, position.offset)] = event
            while len(self._landed) > self.size:
                del self._landed[next(iter(self._landed))]

    def take(self, record: Consumed) -> Event | None:
        """The event a resolution sent, if ``record`` is it; None: decode the record."""
        if record.topic != self.topic:  # before the pop: another topic's record takes none
            return None
        with self._lock:
            event = self._landed.pop((record.partition, record.offset), None)
        if event is None:
            return None
        for key, value in record.headers:
            if key == wire.CE_ID_HEADER:
                return event if value == event.event_id.encode() else None
        return None

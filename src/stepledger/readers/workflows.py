"""The reader names from before :mod:`stepledger.history`: deprecated, still importable.

Every caller reads a workflow through :class:`~stepledger.history.protocol.WorkflowHistory`
(``KafkaHistory``, ``InMemoryHistory``).  The names below keep users' code working:
``KafkaPartitionReader`` and ``KafkaScanReader`` are the Kafka history, and
``InMemoryWorkflowReader`` the in-memory one, behind the older ``read -> list[Event]``
surface; ``Ledger(reader=...)`` takes either kind.  ``SnapshotTailReader`` reads the
projector's snapshot plus the partition's tail after it.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.history.adapt import HistoryReader, WorkflowReader
from stepledger.history.kafka import FIRST_OFFSET, KafkaHistory, ReadStats, read_to_end
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import Until
from stepledger.kafka import Position
from stepledger.log import InMemoryEventLog

__all__ = [
    "InMemoryWorkflowReader",
    "KafkaPartitionReader",
    "KafkaScanReader",
    "ReadStats",
    "SnapshotTailReader",
    "Until",
    "WorkflowReader",
]

logger = logging.getLogger(__name__)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


class InMemoryWorkflowReader(HistoryReader):
    """Deprecated: :class:`~stepledger.history.memory.InMemoryHistory`."""

    def __init__(self, log: InMemoryEventLog, poll_s: float = 0.005) -> None:
        _deprecated("InMemoryWorkflowReader", "stepledger.testing.InMemoryHistory")
        super().__init__(InMemoryHistory(log, poll_s))


class KafkaPartitionReader(HistoryReader):
    """Deprecated: :class:`~stepledger.history.kafka.KafkaHistory`."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        _deprecated(type(self).__name__, "stepledger.history.kafka.KafkaHistory")
        self.kafka = KafkaHistory(settings, codec)
        super().__init__(self.kafka)

    @property
    def last(self) -> ReadStats:
        """What the last read cost."""
        return self.kafka.last


class KafkaScanReader(KafkaPartitionReader):
    """Deprecated: :class:`~stepledger.history.kafka.KafkaHistory` (it reads the workflow's
    partition, every partition only when the partitioner cannot be computed)."""


class SnapshotTailReader:
    """Reads a workflow from the projector's snapshot plus its partition's tail after it.

    ``projection`` is the projector's DuckDB file or shard directory; published snapshots
    are what is opened (read-only; the projector keeps writing its own file).  With no
    snapshot yet, the workflow's partition is read.  A history over it is never known to
    be whole (the snapshot, not an index, knows which ids the log holds): every open
    reads first.
    """

    def __init__(
        self, settings: Settings, projection: str | Path, codec: Codec | None = None
    ) -> None:
        self.settings = settings
        self.projection = Path(projection)
        self.kafka = KafkaHistory(settings, codec)
        self.codec = self.kafka.codec
        self.last = ReadStats()

    def read(self, workflow_id: str) -> list[Event]:
        """The workflow's events: snapshot lookup, then the tail after the snapshot.

        With a shard directory only the shards of the workflow's partitions are opened.
        """
        from stepledger.readers.snapshots import (
            is_shard_dir,
            latest_snapshot,
            workflow_events_from_shards,
            workflow_events_from_snapshot,
        )

        began = time.perf_counter()
        mine = self.kafka._workflow_partitions(workflow_id)
        source: str | None
        if is_shard_dir(self.projection):
            stored, offsets, read = workflow_events_from_shards(
                self.projection, mine, workflow_id, self.codec
            )
            source = ", ".join(str(p) for p in read) or None
        else:
            path = latest_snapshot(self.projection)
            if path is None:
                logger.info("no snapshot of %s yet: reading the partition", self.projection)
                events = self.kafka.read(workflow_id).events
                self.last = self.kafka.last
                return events
            stored, offsets = workflow_events_from_snapshot(path, workflow_id, self.codec)
            source = str(path)
        stored = [e for e in stored if e.workflow_id == workflow_id]
        starts = {tp: offsets.get(tp, FIRST_OFFSET) for tp in mine}
        tail, scanned = read_to_end(self.settings, self.codec, starts, workflow_id)
        seen = {e.event_id for e in stored}
        events = stored + [e for e in tail if e.event_id not in seen]
        elapsed = time.perf_counter() - began
        self.last = ReadStats(len(stored), scanned, len(tail), elapsed, source)
        if len(mine) != 1:
            return events
        # The snapshot holds what was projected below its offset: only a log start past
        # that offset lost something the reader needs.
        return self.kafka.guard.complete(workflow_id, mine[0][1], events, starts[mine[0]])

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after`` in its partition, up to an accepted one."""
        return self.kafka.follow(workflow_id, after, until, timeout_s)

    def close(self) -> None:
        """Close the partition history's clients."""
        self.kafka.close()

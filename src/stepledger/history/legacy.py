"""The reader names from before :mod:`stepledger.history`: deprecated, still importable.

Every caller reads a workflow through :class:`~stepledger.history.protocol.WorkflowHistory`
(``KafkaHistory``, ``InMemoryHistory``).  The names below keep users' code working:
``KafkaPartitionReader`` and ``KafkaScanReader`` are the Kafka history, and
``InMemoryWorkflowReader`` the in-memory one, behind the older ``read -> list[Event]``
surface; ``Ledger(reader=...)`` takes either kind.  ``SnapshotTailReader`` is the Kafka
history whose head is the projector's snapshot (``KafkaHistory(settings, snapshot=...)``),
under that surface; it is not deprecated.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.history.adapt import HistoryReader, WorkflowReader
from stepledger.history.kafka import KafkaHistory, ReadStats
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import Until
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


class SnapshotTailReader(HistoryReader):
    """Reads a workflow from the projector's snapshot plus its partition's tail after it.

    ``projection`` is the projector's DuckDB file or shard directory; published snapshots
    are what is opened (read-only; the projector keeps writing its own file).  With no
    snapshot yet, the workflow's partition is read.
    """

    def __init__(
        self, settings: Settings, projection: str | Path, codec: Codec | None = None
    ) -> None:
        self.settings = settings
        self.projection = Path(projection)
        self.kafka = KafkaHistory(settings, codec, snapshot=self.projection)
        self.codec = self.kafka.codec
        super().__init__(self.kafka)

    @property
    def last(self) -> ReadStats:
        """What the last read cost (``snapshot``: the snapshot or shards it read)."""
        return self.kafka.last

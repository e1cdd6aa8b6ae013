"""A workflow read from the projector's snapshot plus its partition's tail after it.

Where a deployment runs a projector, a resume need not read a long partition from its
start: the snapshot holds what was projected below its offset, and the partition is read
only after it.  The snapshot files are read through :mod:`stepledger.readers.snapshots`
(imported when first used: the SDK needs DuckDB only with this reader).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.history.kafka import FIRST_OFFSET, KafkaHistory, ReadStats, read_to_end
from stepledger.history.protocol import Until
from stepledger.kafka import Position

logger = logging.getLogger(__name__)


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

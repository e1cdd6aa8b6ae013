"""Reading the checkpoint topic: each workflow's newest checkpoint and each partition's progress.

A :class:`CheckpointView` keeps, per checkpoint partition it was asked about, the newest
checkpoint of every key read so far and how far it read, so a later lookup reads only the
checkpoints written since (the topic is compacted: its size follows the workflows, not the
events).  The end of a catch-up is the partition-EOF a fresh consumer reports, as for the
step log's readers.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from stepledger import wire
from stepledger.checkpoints.record import PROGRESS_KEY, WorkflowCheckpoint, decode
from stepledger.config import Settings
from stepledger.errors import BrokerError, CodecError
from stepledger.kafka.client import TopicPartition
from stepledger.kafka.consumer import assigned_consumer, partition_end

logger = logging.getLogger(__name__)

_GROUP = wire.CHECKPOINT_READER_GROUP
_BATCH = 5000
_POLL_S = 0.01
#: A catch-up never takes longer than this.
CATCH_UP_LIMIT_S = 120.0


@dataclass(frozen=True)
class Covering:
    """What the checkpoint topic says about one workflow of one step-log partition."""

    checkpoint: WorkflowCheckpoint | None
    """The workflow's newest checkpoint (None: it has none)."""
    progress: int | None
    """Every workflow with a step-log record at or below this offset has a checkpoint
    covering it (None: no checkpointer has written progress for the partition)."""


class CheckpointView:
    """The newest checkpoints of the partitions asked about, caught up on every lookup."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._latest: dict[int, dict[bytes, WorkflowCheckpoint]] = {}

    def lookup(self, partition: int, workflow_id: str, *, fresh: bool = True) -> Covering:
        """The workflow's checkpoint and the partition's progress.

        ``fresh``: catch the partition up first; otherwise what was read so far (only a
        partition never read is read now).
        """
        with self._lock:
            if fresh or partition not in self._next:
                self._catch_up(partition)
            latest = self._latest.get(partition, {})
            progress = latest.get(PROGRESS_KEY)
            return Covering(
                latest.get(workflow_id.encode()),
                None if progress is None else progress.covered_offset,
            )

    def partition(self, partition: int) -> dict[bytes, WorkflowCheckpoint]:
        """Every newest checkpoint of a partition (the progress record under its key)."""
        with self._lock:
            self._catch_up(partition)
            return dict(self._latest.get(partition, {}))

    def _catch_up(self, partition: int) -> None:
        topic = self.settings.checkpoint_topic
        start = self._next.get(partition, 0)
        latest = self._latest.setdefault(partition, {})
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        starts = [TopicPartition(topic, partition, start)]
        with assigned_consumer(
            self.settings, starts, group=_GROUP, **{"fetch.wait.max.ms": 10}
        ) as consumer:
            while True:
                if time.monotonic() > deadline:
                    raise BrokerError(f"could not read {topic}[{partition}] to its end in time")
                for msg in consumer.consume(_BATCH, _POLL_S):
                    if partition_end(msg):
                        return
                    self._next[partition] = int(msg.offset() or 0) + 1
                    self._take(latest, msg.key() or b"", msg.value())

    @staticmethod
    def _take(latest: dict[bytes, WorkflowCheckpoint], key: bytes, value: bytes | None) -> None:
        if value is None:
            latest.pop(key, None)  # a tombstone
            return
        try:
            found = decode(value)
        except CodecError as exc:
            # Skipped, never fatal: the reader then finds no checkpoint and refuses to guess.
            logger.error("skipped an undecodable checkpoint of key %r: %s", key, exc)
            return
        held = latest.get(key)
        if held is None or found.covered_offset >= held.covered_offset:
            latest[key] = found

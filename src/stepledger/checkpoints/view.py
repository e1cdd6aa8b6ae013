"""Reading the checkpoint topic: each workflow's newest checkpoint and each partition's progress.

A :class:`CheckpointView` keeps, per checkpoint partition it was asked about, the newest
checkpoint of every key read so far and how far it read, so a later lookup reads only the
checkpoints written since (the topic is compacted: its size follows the workflows, not the
events).  The end of a catch-up is the partition-EOF a fresh consumer reports, as for the
step log's readers.

A record read is kept as its bytes and covered offset (read from its first fields,
:func:`~stepledger.checkpoints.record.covered_offset_of`); only the checkpoints handed out
are decoded.  Opening one workflow reads its partition of the checkpoint topic, which
holds every workflow of the partition: decoding them all cost ~24 us each (0.36 s for the
15k checkpoints of a 1M-event partition), the one asked for is decoded once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from stepledger import wire
from stepledger.checkpoints.record import (
    PROGRESS_KEY,
    WorkflowCheckpoint,
    covered_offset_of,
    decode,
)
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


@dataclass
class _Held:
    """The newest record of one key: its covered offset, its bytes, decoded when asked for."""

    covered: int
    value: bytes
    decoded: WorkflowCheckpoint | None = None


class CheckpointView:
    """The newest checkpoints of the partitions asked about, caught up on every lookup."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._latest: dict[int, dict[bytes, _Held]] = {}

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
                _checkpoint(latest, workflow_id.encode()),
                None if progress is None else progress.covered,
            )

    def partition(self, partition: int) -> dict[bytes, WorkflowCheckpoint]:
        """Every newest checkpoint of a partition (the progress record under its key)."""
        with self._lock:
            self._catch_up(partition)
            latest = self._latest.get(partition, {})
            found = {key: _checkpoint(latest, key) for key in list(latest)}
            return {key: checkpoint for key, checkpoint in found.items() if checkpoint}

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
    def _take(latest: dict[bytes, _Held], key: bytes, value: bytes | None) -> None:
        if value is None:
            latest.pop(key, None)  # a tombstone
            return
        try:
            covered = covered_offset_of(value)
        except CodecError as exc:
            # Skipped, never fatal: the reader then finds no checkpoint and refuses to guess.
            logger.error("skipped an undecodable checkpoint of key %r: %s", key, exc)
            return
        held = latest.get(key)
        if held is None or covered >= held.covered:
            latest[key] = _Held(covered, value)


def _checkpoint(latest: dict[bytes, _Held], key: bytes) -> WorkflowCheckpoint | None:
    """The key's newest checkpoint, decoded once; an undecodable one is dropped (None)."""
    held = latest.get(key)
    if held is None:
        return None
    if held.decoded is None:
        try:
            held.decoded = decode(held.value)
        except CodecError as exc:
            # As if never read: the reader finds no checkpoint and refuses to guess.
            logger.error("skipped an undecodable checkpoint of key %r: %s", key, exc)
            del latest[key]
            return None
    return held.decoded

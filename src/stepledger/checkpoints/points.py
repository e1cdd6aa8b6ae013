"""Point reads of one checkpoint partition through its directory (see
:mod:`stepledger.checkpoints.directory` and :mod:`stepledger.checkpoints.view`).

A reader needs the partition's last record (its header names the root, or it is the
root), the root, one chunk, the records after the root and the entry's checkpoint; each
must be a record of the reader's own step log (``admit``), or the directory proves nothing
and the reader reads the whole partition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.record import WorkflowCheckpoint, covered_offset_of, decode
from stepledger.errors import BrokerError
from stepledger.kafka.logid import HeaderPairs
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import Consumed

#: A directory lookup gives up (and the partition is read) after this long.
DIRECTORY_LIMIT_S = 10.0


@dataclass(frozen=True)
class Covering:
    """What the checkpoint topic says about one workflow of one step-log partition."""

    checkpoint: WorkflowCheckpoint | None
    """The workflow's newest checkpoint (None: it has none)."""
    progress: int | None
    """Every workflow with a step-log record at or below this offset has a checkpoint
    covering it (None: no checkpointer has written progress for the partition)."""
    doubtful: bool = False
    """A checkpoint of the partition could not be decoded: a workflow without one is not
    proven to have none (the progress then proves no id new)."""


#: Whether a checkpoint-topic record (its partition and headers) is of the view's step log.
Admit = Callable[[int, HeaderPairs], bool]


@dataclass
class Held:
    """The newest record of one key: its covered offset, its bytes, decoded when asked for."""

    covered: int
    value: bytes
    offset: int = -1
    """Where the record sits in the checkpoint topic (-1: not known)."""
    decoded: WorkflowCheckpoint | None = None


class Points:
    """Point reads of one checkpoint partition through its directory (see the module doc)."""

    def __init__(
        self, reader: PartitionReader, topic: str, partition: int, deadline: float, admit: Admit
    ) -> None:
        self.reader = reader
        self.topic = topic
        self.partition = partition
        self.deadline = deadline
        self.admit = admit

    def _ours(self, record: Consumed) -> bool:
        return self.admit(self.partition, record.headers)

    def covering(self, key: bytes) -> Covering | None:
        """What the directory proves about ``key``, or None when it proves nothing."""
        where = (self.topic, self.partition)
        _, high = self.reader.watermarks(where, timeout=DIRECTORY_LIMIT_S)
        # (librdkafka's logical "one before the end" offset cost ~0.5 s to resolve.)
        last = self.first(high - 1) if high > 0 else None
        if last is None or not self._ours(last):
            return None  # empty (a whole read is as cheap), gone meanwhile, or not ours
        pointer = dirs.root_pointer(last.headers)
        if last.key == dirs.ROOT_KEY:
            pointer = last.offset
        if pointer is None:
            return None  # written before directories (or none written yet)
        # The root, then every record written after it (checkpoints the root does not list).
        after = self._from(pointer)
        if not after or after[0].offset != pointer or after[0].key != dirs.ROOT_KEY:
            return None
        if not self._ours(after[0]):
            return None
        root = dirs.decode(after[0].value)
        if root.bucket != -1 or len(root.chunks) != root.buckets:
            return None
        hashed = dirs.key_hash(key)
        bucket = dirs.bucket_of(hashed, root.buckets)
        chunk_record = self.first(root.chunks[bucket])
        if chunk_record is None or chunk_record.offset != root.chunks[bucket]:
            return None
        if chunk_record.key != dirs.chunk_key(bucket) or not self._ours(chunk_record):
            return None
        chunk = dirs.decode(chunk_record.value)
        if chunk.buckets != root.buckets or chunk.bucket != bucket:
            return None
        newest: Held | None = None
        for offset in chunk.offsets_of(hashed):
            record = self.first(offset)
            if record is None or record.offset != offset:
                return None  # compacted away: a newer checkpoint sits somewhere unlisted
            if record.key == key and self._ours(record):  # else another workflow's (same hash)
                newest = newer(newest, record)
        for record in after[1:]:
            if record.key != key or not self._ours(record):
                continue
            if record.value is None:
                return None  # a tombstone: only a whole read says what is left
            newest = newer(newest, record)
        checkpoint = None if newest is None else decode(newest.value)
        return Covering(checkpoint, root.progress if root.progress >= 0 else None)

    def first(self, offset: int) -> Consumed | None:
        """The first record at or after ``offset`` (None: the partition ends before it)."""
        for record in self._records(offset):
            return record
        return None

    def _from(self, offset: int) -> list[Consumed]:
        """Every record from ``offset`` to the partition's end."""
        return list(self._records(offset))

    def _records(self, offset: int) -> Iterator[Consumed]:
        """The partition's records from ``offset`` up to its end, by the directory's deadline.

        Each poll returns with the first record (a full batch's wait would be paid), then
        what is already fetched is taken without waiting.
        """
        where = (self.topic, self.partition)
        left = max(0.0, self.deadline - time.monotonic())
        for batch in self.reader.follow({where: offset}, within=left, wait_s=1.0, prompt=True):
            end = batch.at_end.get(where)
            for record in batch.records:
                if end is not None and record.offset >= end:
                    return
                yield record
            if end is not None:
                return
        raise BrokerError(f"the directory of {self.topic}[{self.partition}] timed out")


def newer(held: Held | None, record: Consumed) -> Held:
    """The record of higher covered offset: ``held`` or ``record``."""
    value = record.value or b""
    covered = covered_offset_of(value)
    if held is None or covered >= held.covered:
        return Held(covered, value, record.offset)
    return held

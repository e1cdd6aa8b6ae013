"""Reading the checkpoint topic: each workflow's newest checkpoint and each partition's progress.

A :class:`CheckpointView` keeps, per checkpoint partition it was asked about, the newest
checkpoint of every key read so far and how far it read, so a later lookup reads only the
checkpoints written since (the topic is compacted: its size follows the workflows, not the
events).  The end of a catch-up is the partition-EOF a fresh consumer reports, as for the
step log's readers.

A partition the view never read is first looked up through the partition's directory
(:mod:`stepledger.checkpoints.directory`): a handful of point reads instead of the whole
partition, taken only when the directory proves the answer (otherwise the partition is
read as before).  ``lookup(..., fresh=True)`` always reads the partition.

Only records of the view's own step log are read (invariant 21): a record whose
``stepledger_log`` header names another log, or none, is refused (counted in
:attr:`CheckpointView.refusals`, one line per name), and so is a checkpoint or progress
that the step log contradicts: another topic or partition in its fields, or a covered
offset at or past the step-log partition's end (no checkpointer can have read a record
that was never written).  Such a record proves nothing, so the reader refuses to guess.

A record read is kept as its bytes and covered offset (read from its first fields,
:func:`~stepledger.checkpoints.record.covered_offset_of`); only the checkpoints handed out
are decoded.  Opening one workflow reads its partition of the checkpoint topic, which
holds every workflow of the partition: decoding them all cost ~24 us each (0.36 s for the
15k checkpoints of a 1M-event partition), the one asked for is decoded once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.points import DIRECTORY_LIMIT_S, Covering, Held, Points
from stepledger.checkpoints.record import (
    PROGRESS_KEY,
    WorkflowCheckpoint,
    covered_offset_of,
    decode,
)
from stepledger.config import Settings
from stepledger.errors import BrokerError, CodecError
from stepledger.kafka.gaps import LogStart
from stepledger.kafka.logid import HeaderPairs, LogIdentity, Refusals, resolve
from stepledger.kafka.reader import PartitionReader, records_to_end

__all__ = ["CATCH_UP_LIMIT_S", "CheckpointView", "Covering", "LogEnds"]

logger = logging.getLogger(__name__)

#: A catch-up never takes longer than this.
CATCH_UP_LIMIT_S = 120.0
#: Directory answers kept for a second lookup of the same workflow (an open's read-back).
_DIRECTED_KEPT = 256


class LogEnds(Protocol):
    """Where each step-log partition ends now (a :class:`~stepledger.kafka.gaps.LogStart`)."""

    def end(self, topic: str, partition: int) -> int: ...


class CheckpointView:
    """The newest checkpoints of the partitions asked about, caught up on every lookup.

    ``identity`` (default: the settings' step log's, asked of the broker once) is the log
    whose records are read; ``log_ends`` (default: a client of the view's own, closed by
    :meth:`close`) says where its partitions end.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        identity: LogIdentity | None = None,
        log_ends: LogEnds | None = None,
    ) -> None:
        self.settings = settings
        self._identity = identity
        self._refusals: Refusals | None = None
        self._ends = log_ends
        self._own_ends: LogStart | None = None
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._latest: dict[int, dict[bytes, Held]] = {}
        self._whole: set[int] = set()
        """Partitions read to their end at least once (what they held then, and since)."""
        self._doubtful: set[int] = set()
        """Partitions where a checkpoint could not be decoded (see ``Covering.doubtful``)."""
        self._directed: dict[tuple[int, bytes], Covering] = {}
        """What the latest directory lookups proved, by partition and key (at most
        ``_DIRECTED_KEPT``: a stale one only sends the guard to a whole read)."""

    @property
    def refusals(self) -> Refusals:
        """The records this view refused (another step log's, or inconsistent with it)."""
        if self._refusals is None:
            identity = self._identity or resolve(self.settings)
            self._identity = identity
            self._refusals = Refusals(identity, "checkpoints")
        return self._refusals

    def close(self) -> None:
        """Close the client the view made to read the step log's ends (if it made one)."""
        if self._own_ends is not None:
            self._own_ends.close()
            self._own_ends = None

    def lookup(self, partition: int, workflow_id: str, *, fresh: bool = True) -> Covering:
        """The workflow's checkpoint and the partition's progress, each only where the step
        log does not contradict it.

        ``fresh``: catch the partition up first; otherwise what was read so far (only a
        partition never read is read now).
        """
        return self._vouched(partition, self._lookup(partition, workflow_id, fresh=fresh))

    def _lookup(self, partition: int, workflow_id: str, *, fresh: bool) -> Covering:
        with self._lock:
            if not fresh and partition not in self._next:
                key = workflow_id.encode()
                found = self._directed.get((partition, key))
                if found is None:
                    found = self._from_directory(partition, key)
                if found is not None:
                    if len(self._directed) >= _DIRECTED_KEPT:
                        self._directed.pop(next(iter(self._directed)))  # the oldest
                    self._directed[(partition, key)] = found
                    return found
            if fresh or partition not in self._next:
                self._catch_up(partition)
            latest = self._latest.get(partition, {})
            progress = latest.get(PROGRESS_KEY)
            key = workflow_id.encode()
            held = key in latest
            newest = _checkpoint(latest, key)
            if held and newest is None:
                self._doubtful.add(partition)  # dropped: undecodable
            return Covering(
                newest,
                None if progress is None else progress.covered,
                partition in self._doubtful,
            )

    def holds(self, partition: int, workflow_id: str) -> bool | None:
        """Whether the partition's checkpoints, read to their end once, hold one of the
        workflow: no round trip and no wait (None: not read whole, doubtful, or being read)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if partition not in self._whole or partition in self._doubtful:
                return None
            return workflow_id.encode() in self._latest.get(partition, {})
        finally:
            self._lock.release()

    def partition(self, partition: int) -> dict[bytes, WorkflowCheckpoint]:
        """Every newest checkpoint of a partition (the progress record under its key) that
        the step log does not contradict."""
        with self._lock:
            self._catch_up(partition)
            latest = self._latest.get(partition, {})
            found = {key: _checkpoint(latest, key) for key in list(latest)}
        end = self._end_of(partition)
        return {
            key: checkpoint
            for key, checkpoint in found.items()
            if checkpoint and self._consistent(partition, checkpoint, end)
        }

    def at(self, partition: int, offset: int, key: bytes) -> WorkflowCheckpoint | None:
        """The checkpoint of ``key`` at ``offset`` (None: that record is gone or another's)."""
        topic = self.settings.checkpoint_topic
        try:
            with self._points(partition) as points:
                record = points.first(offset)
            if record is None or record.offset != offset or record.key != key or not record.value:
                return None
            if not self._admit(partition, record.headers):
                return None
            return decode(record.value)
        except (BrokerError, CodecError) as exc:
            logger.info("checkpoint at %s[%d]@%d not read: %s", topic, partition, offset, exc)
            return None

    def _admit(self, partition: int, headers: HeaderPairs) -> bool:
        return self.refusals.admit(self.settings.checkpoint_topic, partition, headers)

    def _end_of(self, partition: int) -> int:
        """Where the step-log partition ends now."""
        if self._ends is None:
            self._own_ends = LogStart(self.settings)
            self._ends = self._own_ends
        return self._ends.end(self.settings.topic, partition)

    def _vouched(self, partition: int, covering: Covering) -> Covering:
        """``covering`` without what the step log contradicts (see the module doc)."""
        checkpoint, progress = covering.checkpoint, covering.progress
        if checkpoint is None and progress is None:
            return covering
        end = self._end_of(partition)
        if checkpoint is not None and not self._consistent(partition, checkpoint, end):
            checkpoint = None
        if progress is not None and progress >= end:
            self._past_end(partition, "progress", progress, end)
            progress = None
        return replace(covering, checkpoint=checkpoint, progress=progress)

    def _consistent(self, partition: int, found: WorkflowCheckpoint, end: int) -> bool:
        """False (and counted) for a checkpoint or progress the step log contradicts."""
        topic = self.settings.checkpoint_topic
        if found.topic != self.settings.topic or found.partition != partition:
            where = f"{found.topic}[{found.partition}]"
            self.refusals.refuse(topic, partition, where, f"was folded from {where}")
            return False
        if found.covered_offset >= end:
            what = "progress" if found.workflow_id is None else "a checkpoint"
            self._past_end(partition, what, found.covered_offset, end)
            return False
        return True

    def _past_end(self, partition: int, what: str, covered: int, end: int) -> None:
        why = (
            f"is {what} covering offset {covered}, past the end of {self.settings.topic}"
            f"[{partition}] ({end}): no checkpointer read that record (forged, or of a log "
            "since deleted)"
        )
        self.refusals.refuse(self.settings.checkpoint_topic, partition, "(past the end)", why)

    def offsets(self, partition: int) -> dict[bytes, int]:
        """Where each key's newest checkpoint sits in the partition (after a catch-up)."""
        with self._lock:
            self._catch_up(partition)
            latest = self._latest.get(partition, {})
            return {key: held.offset for key, held in latest.items() if held.offset >= 0}

    def _from_directory(self, partition: int, key: bytes) -> Covering | None:
        """The covering the partition's directory proves, or None (read the partition)."""
        topic = self.settings.checkpoint_topic
        try:
            with self._points(partition) as points:
                return points.covering(key)
        except (BrokerError, CodecError) as exc:
            logger.info("checkpoint directory of %s[%d] not used: %s", topic, partition, exc)
            return None

    @contextlib.contextmanager
    def _points(self, partition: int) -> Iterator[Points]:
        """Point reads of one checkpoint partition, bounded by ``DIRECTORY_LIMIT_S``."""
        # A 1 ms fetch wait: each point read is one fetch of records already there (with
        # 10 ms a read after a new assignment took 12 ms on Kafka, with 1 ms 2-4 ms; with 0
        # Tansu answers no fetch at all).
        topic = self.settings.checkpoint_topic
        group = self.settings.group(wire.CHECKPOINT_READER_ROLE)
        deadline = time.monotonic() + DIRECTORY_LIMIT_S
        quick = self.settings.quick_connect()
        with PartitionReader(
            self.settings, group=group, fetch_wait_ms=1, grows=False, **quick
        ) as reader:
            yield Points(reader, topic, partition, deadline, self._admit)

    def _catch_up(self, partition: int) -> None:
        topic = self.settings.checkpoint_topic
        starts = {(topic, partition): self._next.get(partition, 0)}
        latest = self._latest.setdefault(partition, {})
        group = self.settings.group(wire.CHECKPOINT_READER_ROLE)
        for records in records_to_end(self.settings, starts, group=group, within=CATCH_UP_LIMIT_S):
            for record in records:
                self._next[partition] = record.offset + 1
                admitted = self._admit(partition, record.headers)
                if admitted and not self._take(
                    latest, record.key or b"", record.value, record.offset
                ):
                    self._doubtful.add(partition)
        self._whole.add(partition)

    @staticmethod
    def _take(latest: dict[bytes, Held], key: bytes, value: bytes | None, offset: int = -1) -> bool:
        """Keep a key's record if it is its newest (False: undecodable, skipped)."""
        if dirs.is_directory_key(key):
            return True  # where checkpoints are, not one
        if value is None:
            latest.pop(key, None)  # a tombstone
            return True
        try:
            covered = covered_offset_of(value)
        except CodecError as exc:
            # Skipped, never fatal: the reader then finds no checkpoint and refuses to guess.
            logger.error("skipped an undecodable checkpoint of key %r: %s", key, exc)
            return False
        held = latest.get(key)
        if held is None or covered >= held.covered:
            latest[key] = Held(covered, value, offset)
        return True


def _checkpoint(latest: dict[bytes, Held], key: bytes) -> WorkflowCheckpoint | None:
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

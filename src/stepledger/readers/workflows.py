"""Reading one workflow's events back: the boundary a resume (and the approval CLI) reads through.

Implementations:

- :class:`KafkaPartitionReader` (the default): only the workflow's own partition, from the
  workflow's first record on.  The partition is computed with the producers' partitioner
  (:mod:`stepledger.kafka.partitioner`); a :class:`~stepledger.readers.index.PartitionIndex`
  says where the workflow starts (or that it has no events), reading only the records
  written since the reader's previous read.  The first read in a process reads the
  partition once (keys only).
- :class:`SnapshotTailReader`: the projector's published DuckDB snapshot (an indexed point
  lookup by workflow) plus the workflow's partition's tail after the offset the snapshot
  was taken at.  Its cost follows the workflow's size and the events since the snapshot,
  not the size of the log (see docs/resume-design.md).
- :class:`KafkaScanReader`: every partition from the beginning.  Its cost grows with the
  whole log; it is what a partition reader falls back to when the partitioner is not one
  whose choice can be computed (``random``).
- :class:`InMemoryWorkflowReader`: over an :class:`~stepledger.log.InMemoryEventLog`.

``follow`` waits for the workflow's next events after a known position (an approval, the
recovery daemon's decision) by reading only that partition from there on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast, runtime_checkable

from stepledger import wire
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.errors import BrokerError, StepLedgerError
from stepledger.kafka import Position, listed_topics
from stepledger.kafka.partitioner import configured, partition_of
from stepledger.kafka.reader import PartitionReader, records_to_end
from stepledger.log import InMemoryEventLog, codec_for
from stepledger.readers.history import HistoryGuard
from stepledger.readers.index import PartitionIndex
from stepledger.topics import check_retention

logger = logging.getLogger(__name__)

Until = Callable[[Event], bool]
Starts = dict[tuple[str, int], int]

#: Where a scan starts: offset 0, not the logical "beginning", which costs a ListOffsets
#: round that took ~0.5 s on the dev broker (a concrete offset ~10 ms).  An offset removed
#: by retention is reset to the earliest one (``auto.offset.reset``).
FIRST_OFFSET = 0
#: A reader never waits longer than this to reach the end of the partitions it reads.
READ_LIMIT_S = 120.0


class WorkflowReader(Protocol):
    """Reads the events of one workflow, in log order."""

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow recorded so far."""
        ...

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after``, up to the first one ``until`` accepts.

        Returns early with what was read when ``timeout_s`` passes.
        """
        ...

    def close(self) -> None:
        """Release the reader's resources."""
        ...


@runtime_checkable
class BoundedReader(Protocol):
    """A reader that can end a read at a record this process had acknowledged."""

    def read_through(self, workflow_id: str, position: Position) -> list[Event]:
        """The workflow's events up to at least ``position`` (one of its own records)."""
        ...

    def read_through_now(self, workflow_id: str, position: Position) -> list[Event] | None:
        """:meth:`read_through` if it can be answered at once, without waiting (else None)."""
        ...

    def unseen(self, workflow_id: str) -> bool:
        """True when the reader has good reason, without a round trip, to think the id new."""
        ...

    def tailed(self, workflow_id: str) -> list[Event] | None:
        """The workflow's events as last read, without a round trip (None: unknown)."""
        ...

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Note that this process recorded a claim or an end of the workflow at ``position``."""
        ...


_BOUNDED: dict[type, bool] = {}


def bounded(reader: object) -> BoundedReader | None:
    """The reader, when its class is a :class:`BoundedReader` that does not opt out with
    ``bounded_reads = False`` (judged once per class: the protocol check costs ~10 us, and
    an open asked it three times)."""
    kind = type(reader)
    known = _BOUNDED.get(kind)
    if known is None:
        opted = getattr(kind, "bounded_reads", True)
        known = _BOUNDED[kind] = bool(opted) and isinstance(reader, BoundedReader)
    return cast(BoundedReader, reader) if known else None


@dataclass
class ReadStats:
    """What the last read cost: where its events came from and how long it took."""

    snapshot_events: int = 0
    tail_records: int = 0
    tail_events: int = 0
    seconds: float = 0.0
    snapshot: str | None = None


class InMemoryWorkflowReader:
    """Reads workflows from an in-memory log (for tests and users' own unit tests)."""

    def __init__(self, log: InMemoryEventLog, poll_s: float = 0.005) -> None:
        self.log = log
        self.poll_s = poll_s

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow in the log."""
        return self.log.workflow_events(workflow_id)

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after`` up to the first accepted one (or timeout)."""
        index = 0 if after is None else after.offset + 1
        found: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while True:
            fresh = self.log.events[index:]
            index += len(fresh)
            for event in fresh:
                if event.workflow_id == workflow_id:
                    found.append(event)
                    if until(event):
                        return found
            if time.monotonic() >= deadline:
                return found
            time.sleep(self.poll_s)

    def close(self) -> None:
        """Nothing to release."""


class KafkaScanReader:
    """Reads a workflow by scanning every partition of the topic from the beginning."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        self.settings = settings
        self.codec = codec or codec_for(settings)
        self.last = ReadStats()
        self._known: list[tuple[str, int]] | None = None
        self.history = HistoryGuard(settings, self.codec)
        """Completes what the log still holds with checkpoints, or refuses (expired head)."""

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow: a scan of the whole topic (cost grows with the log).

        Where the workflow's partition can be computed and its head was deleted, the
        history is completed from the workflow's checkpoint, or HistoryExpiredError.
        """
        check_retention(self.settings, "reader")
        began = time.perf_counter()
        starts = dict.fromkeys(self._partitions(), FIRST_OFFSET)
        events, scanned = read_to_end(self.settings, self.codec, starts, workflow_id)
        self.last = ReadStats(0, scanned, len(events), time.perf_counter() - began)
        home = self._home(workflow_id)
        return events if home is None else self.history.complete(workflow_id, home, events)

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after`` in its partition, up to an accepted one."""
        return follow_partition(self.settings, self.codec, workflow_id, after, until, timeout_s)

    def close(self) -> None:
        """Close the history guard's clients."""
        self.history.close()

    def _home(self, workflow_id: str) -> int | None:
        """The workflow's partition as the producers' partitioner picks it (None: random)."""
        known = self._partitions()
        partitioner = configured(self.settings.client_config())
        chosen = partition_of(workflow_id.encode(), len(known), partitioner)
        return None if chosen is None or (self.settings.topic, chosen) not in known else chosen

    def _partitions(self) -> list[tuple[str, int]]:
        # Asked once per reader: a metadata round costs more than reading a short tail.
        if self._known is None:
            topic = self.settings.topic
            listed = listed_topics(self.settings)
            if not listed.get(topic):
                where = self.settings.bootstrap
                raise BrokerError(f"topic {topic!r} does not exist on {where}", retryable=False)
            self._known = [(topic, p) for p in listed[topic]]
            # The same listing tells the history guard whether checkpoints exist.
            self.history.saw_topics(listed)
        return self._known

    def _workflow_partitions(self, workflow_id: str) -> list[tuple[str, int]]:
        """Every partition (a whole-topic scan reads them all)."""
        return self._partitions()


class KafkaPartitionReader(KafkaScanReader):
    """Reads a workflow from its own partition only, computed as the producers' partitioner does.

    The default reader of a :class:`~stepledger.producer.Ledger`: opening a workflow reads
    one partition from its beginning, not the topic.  With a partitioner whose choice
    cannot be computed (``-X partitioner=random``) it scans every partition.
    """

    bounded_reads = True
    """Opens may claim first and read through their claims (:func:`bounded`)."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        super().__init__(settings, codec)
        self.index = PartitionIndex(settings)
        """Where each workflow starts in its partition, kept up to date incrementally."""

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow: its partition from the workflow's first record on.

        The index is caught up first (the records since the last read, keys only): a
        workflow not in it has no events and nothing more is read.  Where the partition's
        head was deleted, the history is completed from the workflow's checkpoint, or the
        read raises HistoryExpiredError (see :mod:`stepledger.readers.history`).
        """
        return self._read(workflow_id, None)

    def read_through(self, workflow_id: str, position: Position) -> list[Event]:
        """The workflow's events up to at least ``position``, a record of it this process had
        acknowledged (its started event, its claim).

        Everything acknowledged before that record lies below it, so the index's catch-up
        ends there instead of at a fresh end, reading on from its tail (no assignment).
        """
        return self._read(workflow_id, position)

    def read_through_now(self, workflow_id: str, position: Position) -> list[Event] | None:
        """:meth:`read_through` from what the index's tail has fetched already, or None.

        Never waits and makes no round trip (an event loop asks it first): None when the
        records through ``position`` are not fetched yet, or the workflow's whole history
        is not in the index.
        """
        home = self._listed_home(workflow_id)
        if home is None or home != (position.topic, position.partition):
            return None
        found = self.index.lookup_now(home, workflow_id.encode(), position.offset)
        return None if found is None or not found.whole else _decoded(found.records, self.codec)

    def unseen(self, workflow_id: str) -> bool:
        """True when the index, tailing the workflow's partition from offset 0, never saw
        the id (no round trip).  A hint: a record of it may have landed since."""
        home = self._listed_home(workflow_id)
        return home is not None and self.index.unseen(home, workflow_id.encode())

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Note that this process recorded a claim or an end of the workflow at ``position``."""
        if self._known is not None:
            where = (position.topic, position.partition)
            self.index.wrote(where, workflow_id.encode(), position.offset)

    def tailed(self, workflow_id: str) -> list[Event] | None:
        """The workflow's events as the index's tail last read them (no round trip), when
        they are its whole history; None when the index cannot say.  A hint: events may
        have landed since (read back through a record of your own before counting on it)."""
        home = self._listed_home(workflow_id)
        values = None if home is None else self.index.tailed(home, workflow_id.encode())
        return None if values is None else _decoded(values, self.codec)

    def _listed_home(self, workflow_id: str) -> tuple[str, int] | None:
        """The workflow's one partition, when the partitions were listed already (listing
        them would be a round trip) and the partitioner can be computed."""
        if self._known is None:
            return None
        mine = self._workflow_partitions(workflow_id)
        return mine[0] if len(mine) == 1 else None

    def _read(self, workflow_id: str, through: Position | None) -> list[Event]:
        check_retention(self.settings, "sdk")
        mine = self._workflow_partitions(workflow_id)
        bound = None
        if through is not None and [(through.topic, through.partition)] == mine:
            bound = through.offset
        events, whole = self._read_log(workflow_id, mine, bound)
        if len(mine) != 1 or whole:
            return events  # whole: the index saw the partition from offset 0, no broker round
        return self.history.complete(workflow_id, mine[0][1], events)

    def _read_log(
        self, workflow_id: str, mine: list[tuple[str, int]], bound: int | None = None
    ) -> tuple[list[Event], bool]:
        """The workflow's events, and whether they are its whole history for certain."""
        began = time.perf_counter()
        starts = dict.fromkeys(mine, FIRST_OFFSET)
        if len(mine) == 1:
            indexed = self.index.records
            found = self.index.lookup(mine[0], workflow_id.encode(), bound)
            if found.complete:
                # The catch-up saw every record of the workflow (or there are none).
                events = _decoded(found.records, self.codec)
                read = self.index.records - indexed
                self.last = ReadStats(0, read, len(events), time.perf_counter() - began)
                return events, found.whole
            starts = {mine[0]: found.first or FIRST_OFFSET}
        events, scanned = read_to_end(self.settings, self.codec, starts, workflow_id)
        self.last = ReadStats(0, scanned, len(events), time.perf_counter() - began)
        return events, False

    def close(self) -> None:
        """Close the index's consumer and the history guard's clients."""
        self.index.close()
        self.history.close()

    def _workflow_partitions(self, workflow_id: str) -> list[tuple[str, int]]:
        known = self._partitions()
        partitioner = configured(self.settings.client_config())
        chosen = partition_of(workflow_id.encode(), len(known), partitioner)
        if chosen is None or (self.settings.topic, chosen) not in known:
            return known
        return [(self.settings.topic, chosen)]


class SnapshotTailReader(KafkaPartitionReader):
    """Reads a workflow from the projector's snapshot plus its partition's tail after it.

    Not a :class:`BoundedReader` (``bounded_reads``): the snapshot, not the index, knows
    which ids the log holds, so every open reads first.

    ``projection`` is the projector's DuckDB file or shard directory; published snapshots
    are what is opened (read-only; the projector keeps writing its own file).  With no snapshot yet,
    the read falls back to a scan of the topic.
    """

    bounded_reads = False

    def __init__(
        self, settings: Settings, projection: str | Path, codec: Codec | None = None
    ) -> None:
        super().__init__(settings, codec)
        self.projection = Path(projection)

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
        mine = self._workflow_partitions(workflow_id)
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
                return super().read(workflow_id)
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
        return self.history.complete(workflow_id, mine[0][1], events, starts[mine[0]])


def read_to_end(
    settings: Settings, codec: Codec, starts: Starts, workflow_id: str
) -> tuple[list[Event], int]:
    """One workflow's events from the given offsets up to each partition's end.

    Returns the events and how many records were scanned.
    """
    key = workflow_id.encode()
    found: list[Event] = []
    scanned = 0
    group = settings.group(wire.WORKFLOW_READER_ROLE)
    for records in records_to_end(settings, starts, group=group, within=READ_LIMIT_S):
        scanned += len(records)
        for record in records:
            if record.key == key:
                _decode_value(found, record.value or b"", codec)
    return found, scanned


def follow_partition(
    settings: Settings,
    codec: Codec,
    workflow_id: str,
    after: Position | None,
    until: Until,
    timeout_s: float,
) -> list[Event]:
    """The workflow's events after a position in its partition, up to an accepted one."""
    if after is None:
        raise BrokerError("following a workflow needs a position it wrote", retryable=False)
    key = workflow_id.encode()
    found: list[Event] = []
    starts = {(after.topic, after.partition): after.offset + 1}
    with PartitionReader(settings, group=settings.group(wire.WORKFLOW_READER_ROLE)) as reader:
        for batch in reader.follow(starts, within=timeout_s):
            for record in batch.records:
                if record.key != key:
                    continue
                _decode_value(found, record.value or b"", codec)
                if found and until(found[-1]):
                    return found
    return found


def _decoded(values: list[bytes], codec: Codec) -> list[Event]:
    events: list[Event] = []
    for value in values:
        _decode_value(events, value, codec)
    return events


def _decode_value(found: list[Event], value: bytes, codec: Codec) -> None:
    try:
        found.append(codec.decode(value))
    except StepLedgerError as exc:
        # The projector dead-letters such a record; a resume can only go on without it.
        logger.warning("skipped an undecodable record of the workflow: %s", exc)

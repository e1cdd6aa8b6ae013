"""State topics in memory: the checkpoint topic and the clients the checkpoints package uses.

The checkpointer (:mod:`stepledger.checkpoints.writer`) and the checkpoint view
(:mod:`stepledger.checkpoints.view`, with its directory point reads) run unchanged; only
their Kafka clients are replaced:

- :class:`MemTopic`: a topic's partitions as lists of records (key, value, headers), never
  compacted (a reader takes each key's newest record as it would after compaction);
- :class:`MemReader`: the library's partition reader with its client's part (``assign``,
  ``poll``, watermarks) over memory topics, partition ends reported as a client does;
- :class:`MemProducer`: the checkpointer's ``DurableProducer`` (``send`` appends at once,
  ``wait`` is the actor's crossing, as an acknowledgement's wait is);
- :func:`step_message`: a step-log record as the checkpointer's consumer hands it over;
- :class:`SimLogStart`: where a step log's partitions start and end (retention moves the
  start), as :class:`~stepledger.kafka.gaps.LogStart` says it;
- :func:`clients`: the view's reads (``PartitionReader``, ``records_to_end``) pointed at
  memory topics for the length of a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints import view as view_module
from stepledger.checkpoints.record import PROGRESS_KEY, decode
from stepledger.codec import Codec
from stepledger.errors import CodecError
from stepledger.kafka import Position
from stepledger.kafka.gaps import Gap, gaps_below
from stepledger.kafka.reader import BATCH, PartitionReader
from stepledger.kafka.records import Consumed, Polled, Where
from stepledger_dev.simulate.scheduler import Actor, Scheduler
from stepledger_dev.simulate.simlog import Broker, Record

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class MemRecord:
    """One record of a memory topic, and which actor wrote it."""

    key: bytes
    value: bytes | None
    headers: Headers
    writer: str


@dataclass
class MemTopic:
    """A topic in memory: every record ever written, per partition."""

    name: str
    partitions: list[list[MemRecord]] = field(default_factory=list)
    on_write: list[Callable[[int, MemRecord], None]] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, partitions: int) -> MemTopic:
        """An empty topic of ``partitions`` partitions."""
        return cls(name, [[] for _ in range(partitions)])

    def write(self, partition: int, record: MemRecord) -> int:
        """Append a record; its offset."""
        records = self.partitions[partition]
        records.append(record)
        for listener in self.on_write:
            listener(partition, record)
        return len(records) - 1


class MemReader(PartitionReader):
    """The partition reader over memory topics: fixed assignments, no group, no waiting.

    Only the client's part is replaced (``assign``, ``poll``, ``watermarks``): the reads
    themselves (:meth:`~PartitionReader.to_end`, :meth:`~PartitionReader.follow`) are the
    library's, so the simulator runs their loops as they are.
    """

    def __init__(self, topics: dict[str, MemTopic], settings: Any, **options: Any) -> None:
        super().__init__(settings, **options)
        self.topics = topics
        self._at: list[list[Any]] = []
        """Each assigned partition: [topic, partition, next offset, end reported]."""

    def assign(self, starts: Mapping[Where, int]) -> None:
        """Read these partitions from their offsets (a negative offset: the beginning)."""
        self._at = [
            [topic, number, max(0, offset), False] for (topic, number), offset in starts.items()
        ]

    def unassign(self) -> None:
        """Read nothing."""
        self._at = []

    def poll(self, limit: int = BATCH, wait_s: float = 0.0, *, prompt: bool = False) -> Polled:
        """Up to ``limit`` records of the assignment, each partition's end reported once
        when reached."""
        found: list[Consumed] = []
        result = Polled(found)
        for at in self._at:
            name, number = at[0], at[1]
            records = self.topics[name].partitions[number]
            while len(found) < limit and at[2] < len(records):
                found.append(_consumed(name, number, at[2], records[at[2]]))
                at[2] += 1
                at[3] = False
            if len(found) < limit and at[2] >= len(records) and not at[3]:
                result.at_end[(name, number)] = at[2]
                at[3] = True
        result.answered = bool(found or result.at_end)
        return result

    def watermarks(self, where: Where, *, timeout: float = 0.0) -> tuple[int, int]:
        """The partition's low and high offsets (nothing is ever deleted here)."""
        topic, number = where
        return 0, len(self.topics[topic].partitions[number])

    def close(self) -> None:
        """Nothing to release."""
        self._at = []


def _consumed(topic: str, partition: int, offset: int, record: MemRecord) -> Consumed:
    return Consumed(topic, partition, offset, record.key, record.value, list(record.headers))


def clients(topics: dict[str, MemTopic]) -> contextlib.ExitStack:
    """The checkpoint view's reads read ``topics`` until the returned stack closes."""

    def reader(settings: Any, **options: Any) -> MemReader:
        return MemReader(topics, settings, **options)

    def records_to_end(
        settings: Any, starts: Mapping[Where, int], *, within: float, **options: Any
    ) -> Iterator[list[Consumed]]:
        with reader(settings, **options) as read:
            yield from read.to_end(starts, within=within)

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(view_module, "PartitionReader", reader))
    stack.enter_context(mock.patch.object(view_module, "records_to_end", records_to_end))
    return stack


class MemProducer:
    """One actor's producer of state records: appended at once, acknowledged at a crossing."""

    def __init__(self, topics: dict[str, MemTopic], sched: Scheduler, actor: Actor) -> None:
        self.topics, self.sched, self.actor = topics, sched, actor

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        *,
        partition: int | None = None,
    ) -> Future[Position]:
        """Append one record to ``partition`` of ``topic``."""
        pairs = [(str(k), v if isinstance(v, bytes) else str(v).encode()) for k, v in headers or []]
        record = MemRecord(key or b"", value, pairs, self.actor.name)
        offset = self.topics[topic].write(partition or 0, record)
        future: Future[Position] = Future()
        future.set_result(Position(topic, partition or 0, offset))
        return future

    def wait(self, future: Future[Position], timeout: float | None = None) -> Position:
        """The acknowledgement: others run meanwhile."""
        self.sched.point(self.actor)
        return future.result()

    def close(self, timeout: float = 0.0) -> None:
        """Nothing to flush."""


def checkpoint_events(record: MemRecord, codec: Codec) -> tuple[str, list[str]] | None:
    """A workflow checkpoint's workflow and the ids of the events it holds (None: the record
    is a progress, a directory record or a tombstone)."""
    if record.value is None or record.key == PROGRESS_KEY or dirs.is_directory_key(record.key):
        return None
    checkpoint = decode(record.value)
    ids = []
    for value in checkpoint.events:
        try:
            ids.append(codec.decode(value).event_id)
        except CodecError:
            continue  # a foreign writer's bytes on the step log: kept, skipped by readers
    return checkpoint.workflow_id or "", ids


def step_message(record: Record) -> Consumed:
    """A step-log record as the checkpointer's reader hands it over."""
    return Consumed(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        list(record.headers),
    )


class SimLogStart:
    """Where a simulated step log's partitions start and end (a ``LogStart``)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def of(self, topic: str, partition: int) -> int:
        """The partition's first offset still held."""
        return self.broker.partitions[partition].start

    def end(self, topic: str, partition: int) -> int:
        """The offset the partition's next record gets."""
        return self.broker.partitions[partition].end

    def gaps(self, wanted: dict[tuple[str, int], int]) -> list[Gap]:
        """The partitions whose wanted next offset is below their log start."""
        return gaps_below(self.of, wanted)

    def close(self) -> None:
        """Nothing to release."""

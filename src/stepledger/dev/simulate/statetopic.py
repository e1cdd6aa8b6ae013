"""State topics in memory: the checkpoint topic and the clients the checkpoints package uses.

The checkpointer (:mod:`stepledger.checkpoints.writer`) and the checkpoint view
(:mod:`stepledger.checkpoints.view`, with its directory point reads) run unchanged; only
their Kafka clients are replaced:

- :class:`MemTopic`: a topic's partitions as lists of records (key, value, headers), never
  compacted (a reader takes each key's newest record as it would after compaction);
- :class:`MemConsumer`: ``assign``, ``poll``, ``consume`` and watermarks over memory topics,
  with the partition-end event the readers stop at;
- :class:`MemProducer`: the checkpointer's ``DurableProducer`` (``send`` appends at once,
  ``wait`` is the actor's crossing, as an acknowledgement's wait is);
- :func:`step_message`: a step-log record as the checkpointer's consumer hands it over;
- :class:`SimLogStart`: where a step log's partitions start and end (retention moves the
  start), as :class:`~stepledger.gaps.LogStart` says it;
- :func:`clients`: the view's two consumer factories (``reading_to_end``,
  ``assigned_consumer``) pointed at memory topics for the length of a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints import view as view_module
from stepledger.checkpoints.record import PROGRESS_KEY, decode
from stepledger.codec import Codec
from stepledger.dev.simulate.scheduler import Actor, Scheduler
from stepledger.dev.simulate.simlog import Broker, Record
from stepledger.errors import CodecError
from stepledger.gaps import Gap
from stepledger.kafka import Position
from stepledger.kafka.client import KafkaError, TopicPartition

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


class _Eof:
    """The error a consumer reports at a partition's end (``partition_end`` stops there)."""

    def code(self) -> int:
        return int(KafkaError._PARTITION_EOF)

    def str(self) -> str:
        return "partition end"


@dataclass(frozen=True)
class MemMessage:
    """A consumed record, shaped as confluent-kafka's ``Message``."""

    _topic: str
    _partition: int
    _offset: int
    _record: MemRecord | None
    """None: the partition-end event."""

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None if self._record is None else self._record.key

    def value(self) -> bytes | None:
        return None if self._record is None else self._record.value

    def headers(self) -> Headers:
        return [] if self._record is None else list(self._record.headers)

    def error(self) -> _Eof | None:
        return _Eof() if self._record is None else None


class MemConsumer:
    """A consumer over memory topics: fixed assignments, no group, no waiting."""

    def __init__(self, topics: dict[str, MemTopic]) -> None:
        self.topics = topics
        self._at: list[list[Any]] = []
        """Each assigned partition: [topic, partition, next offset, end reported]."""

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions from their offsets (a negative offset: the beginning)."""
        self._at = [[tp.topic, tp.partition, max(0, tp.offset), False] for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0.0) -> tuple[int, int]:
        """The partition's low and high offsets (nothing is ever deleted here)."""
        return 0, len(self.topics[tp.topic].partitions[tp.partition])

    def poll(self, timeout: float = 0.0) -> MemMessage | None:
        """The next record (or partition end) of the assignment; None when nothing is left."""
        found = self.consume(1, timeout)
        return found[0] if found else None

    def consume(self, limit: int, timeout: float = 0.0) -> list[MemMessage]:
        """Up to ``limit`` records, each partition's end reported once when reached."""
        found: list[MemMessage] = []
        for at in self._at:
            name, number = at[0], at[1]
            records = self.topics[name].partitions[number]
            while len(found) < limit and at[2] < len(records):
                found.append(MemMessage(name, number, at[2], records[at[2]]))
                at[2] += 1
                at[3] = False
            if len(found) < limit and at[2] >= len(records) and not at[3]:
                found.append(MemMessage(name, number, at[2], None))
                at[3] = True
        return found

    def close(self) -> None:
        """Nothing to release."""


def clients(topics: dict[str, MemTopic]) -> contextlib.ExitStack:
    """The checkpoint view's consumers read ``topics`` until the returned stack closes."""

    @contextlib.contextmanager
    def reading_to_end(settings: Any, starts: Iterable[TopicPartition], **_: Any) -> Iterator[Any]:
        consumer = MemConsumer(topics)
        consumer.assign(starts)
        yield consumer

    @contextlib.contextmanager
    def assigned_consumer(
        settings: Any, starts: Iterable[TopicPartition], **_: Any
    ) -> Iterator[Any]:
        consumer = MemConsumer(topics)
        consumer.assign(starts)
        yield consumer

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(view_module, "reading_to_end", reading_to_end))
    stack.enter_context(mock.patch.object(view_module, "assigned_consumer", assigned_consumer))
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


def step_message(record: Record) -> MemMessage:
    """A step-log record as a consumer hands it to the checkpointer."""
    held = MemRecord(record.key or b"", record.value, list(record.headers), record.writer)
    return MemMessage(record.topic, record.partition, record.offset, held)


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
        found = []
        for (topic, partition), expected in sorted(wanted.items()):
            low = self.of(topic, partition)
            if low > max(0, expected):
                found.append(Gap(topic, partition, max(0, expected), low))
        return found

    def close(self) -> None:
        """Nothing to release."""

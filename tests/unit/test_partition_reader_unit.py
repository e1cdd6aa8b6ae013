"""The one partition reader: where a read ends, when it gives up, how it grows its wait."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka import reader as readers
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import Consumed, Polled, fatal_error

WHERE = ("log", 0)
OTHER = ("log", 1)


def _record(offset: int, where: tuple[str, int] = WHERE) -> Message:
    return Message(topic=where[0], partition=where[1], offset=offset, key=b"k", value=b"v")


def _end(offset: int, where: tuple[str, int] = WHERE) -> Message:
    error = KafkaError(KafkaError._PARTITION_EOF)
    return Message(topic=where[0], partition=where[1], offset=offset, error=error)


class _Client:
    """A consumer handing out what is queued in it; ``position`` is what it handed over."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.queued: list[Message] = []
        self.assigned: list[tuple[str, int, int]] = []
        self.positions: dict[tuple[str, int], int] = {}
        self.closed = False

    def assign(self, parts: list[TopicPartition]) -> None:
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in parts]

    def consume(self, limit: int, timeout: float) -> list[Message]:
        batch, self.queued = self.queued[:limit], self.queued[limit:]
        for msg in batch:
            if msg.error() is None:
                where = (str(msg.topic()), int(msg.partition() or 0))
                self.positions[where] = int(msg.offset() or 0) + 1
        return batch

    def poll(self, timeout: float) -> Message | None:
        batch = self.consume(1, timeout)
        return batch[0] if batch else None

    def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)
            )
            for tp in parts
        ]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[_Client]:
    """The clients the readers made, oldest first."""
    made: list[_Client] = []

    def new_consumer(conf: dict[str, Any]) -> _Client:
        made.append(_Client(conf))
        return made[-1]

    monkeypatch.setattr(readers, "new_consumer", new_consumer)
    return made


def _offsets(batches: list[list[Consumed]]) -> list[int]:
    return [record.offset for batch in batches for record in batch]


def test_a_read_to_the_end_hands_over_nothing_past_the_end_first_reported(
    clients: list[_Client],
) -> None:
    reader = PartitionReader(Settings(), group="g")
    reader._client.queued = [_record(0), _record(1), _end(2), _record(2), _record(5, OTHER)]  # type: ignore[attr-defined]
    reads = reader.to_end({WHERE: 0, OTHER: 5}, within=5)
    next_batch = next(reads)
    assert [r.offset for r in next_batch] == [0, 1, 5]  # offset 2 came after the end
    clients[0].queued = [_record(3), _end(6, OTHER)]
    assert list(reads) == []  # both done: what came after the first end is newer
    assert clients[0].assigned == [("log", 0, 0), ("log", 1, 5)]
    reader.close()
    assert clients[0].closed


def test_a_read_through_a_known_offset_ends_there_without_an_end(clients: list[_Client]) -> None:
    with PartitionReader(Settings(), group="g") as reader:
        reader._client.queued = [_record(n) for n in range(6)]  # type: ignore[attr-defined]
        batches = list(reader.to_end({WHERE: 0}, within=5, through={WHERE: 2}))
    assert _offsets(batches) == [0, 1, 2]


def test_a_read_that_does_not_reach_its_end_in_time_says_which_partition(
    clients: list[_Client],
) -> None:
    with (
        PartitionReader(Settings(), group="g") as reader,
        pytest.raises(BrokerError, match=r"log\[0\]"),
    ):
        list(reader.to_end({WHERE: 0}, within=0.05))


def test_a_starved_read_grows_its_wait_and_reads_on_where_it_was(clients: list[_Client]) -> None:
    reader = PartitionReader(Settings(), group="g", fetch_wait_ms=10)
    reader.assign({WHERE: 0})
    clients[0].queued = [_record(0), _record(1)]
    assert len(reader.poll().records) == 2
    reader._progress -= readers.starved_after(10) + 1  # nothing came for a while
    assert reader.poll().records == []
    assert reader.grown == 1 and reader.fetch_wait_ms == 50
    assert clients[0].closed and clients[1].conf["fetch.wait.max.ms"] == 50
    assert clients[1].assigned == [("log", 0, 2)]  # past what was handed over
    reader.close()


def test_a_reader_that_does_not_grow_leaves_it_to_its_caller(clients: list[_Client]) -> None:
    reader = PartitionReader(Settings(), group="g", grows=False)
    reader.assign({WHERE: 0})
    reader._progress -= 10
    assert reader.poll().records == [] and reader.starved() and reader.grown == 0
    assert reader.grow() and len(clients) == 2
    reader.close()


def test_an_error_stops_a_bounded_read_and_only_a_fatal_one_a_long_one(
    clients: list[_Client],
) -> None:
    down = KafkaError(KafkaError._TRANSPORT, "broker down")
    bounded = PartitionReader(Settings(), group="g", what="reading the log")
    bounded.assign({WHERE: 0})
    clients[0].queued = [Message(topic="log", partition=0, error=down)]
    with pytest.raises(BrokerError, match="reading the log failed"):
        bounded.poll()
    long = PartitionReader(Settings(), group="g", failure=fatal_error("consume"))
    long.assign({WHERE: 0})
    clients[1].queued = [Message(topic="log", partition=0, error=down), _record(0)]
    assert [r.offset for r in long.poll().records] == [0]  # retried by the client


def test_a_follow_ends_when_its_callback_says_so(clients: list[_Client]) -> None:
    polls: list[Polled] = []
    with PartitionReader(Settings(), group="g") as reader:
        for batch in reader.follow({WHERE: 0}, stop=lambda: len(polls) == 3):
            polls.append(batch)
    assert len(polls) == 3


def test_a_partition_is_at_its_end_until_a_record_past_the_end_comes() -> None:
    at_end: set[tuple[str, int]] = set()
    Polled([], {WHERE: 4}).ends_now(at_end)
    assert at_end == {WHERE}
    Polled([Consumed("log", 0, 4, None, None)]).ends_now(at_end)
    assert at_end == set()
    # An end reported after the batch's last record of the partition: at the end again.
    Polled([Consumed("log", 0, 5, None, None)], {WHERE: 6}).ends_now(at_end)
    assert at_end == {WHERE}

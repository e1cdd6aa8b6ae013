"""Reading the log back: decode a topic's records from assigned partitions (no group join)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.errors import BrokerError, StepLedgerError
from stepledger.kafka import FAST_CONSUMER, Headers, Position, position_of, topic_partitions


@dataclass(frozen=True)
class Record:
    """One consumed record: its position, raw parts and the decoded event or the error."""

    position: Position
    key: bytes | None
    value: bytes | None
    headers: Headers
    event: Event | None
    error: StepLedgerError | None


def read_topic(
    settings: Settings,
    codec: Codec,
    *,
    topic: str | None = None,
    from_beginning: bool = True,
    idle_timeout: float = 1.0,
    max_time: float | None = None,
    follow: bool = False,
    stopped: Callable[[], bool] | None = None,
) -> Iterator[Record]:
    """Yield decoded records of every partition until each reached its end and stayed idle.

    The end is detected from partition-EOF events, not from a fresh ListOffsets (which the
    dev broker answers wrongly after batched produces).  ``stopped`` ends the read (also a
    ``follow``) as soon as it returns True; it is asked at least every 100 ms.
    """
    topic = topic or settings.topic
    partitions = topic_partitions(settings, topic)
    consumer = Consumer(
        settings.client_config(**{**FAST_CONSUMER, "group.id": "stepledger-reader"})
    )
    start = OFFSET_BEGINNING if from_beginning else -1  # -1 is OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in partitions])
    at_end: set[int] = set()
    began = last_data = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if max_time is not None and now - began > max_time:
                return
            if stopped is not None and stopped():
                return
            if not follow and len(at_end) == len(partitions) and now - last_data > idle_timeout:
                return
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(int(msg.partition() or 0))
                    continue
                raise BrokerError(f"consume failed: {err.str()}")
            at_end.discard(int(msg.partition() or 0))
            last_data = time.monotonic()
            yield _record(msg, codec)
    finally:
        consumer.close()


def _record(msg: Message, codec: Codec) -> Record:
    value, key = msg.value(), msg.key()
    try:
        event, error = codec.decode(value), None
    except StepLedgerError as exc:
        event, error = None, exc
    return Record(position_of(msg), key, value, message_headers(msg), event, error)


def message_headers(msg: Message) -> Headers:
    """A consumed record's headers as they were produced (a header without a value stays None)."""
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [
        (k, None if v is None else v.encode() if isinstance(v, str) else bytes(v)) for k, v in pairs
    ]

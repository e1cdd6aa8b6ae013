"""The dead-letter topic: nothing is lost on bad input, and no letter can block a partition.

A dead letter copies the original key, value and headers (a null key or value stays null,
a header without a value keeps no value) and adds ``dlq_*`` headers naming the original
topic, partition, offset, consumer group, the stage that refused it and why.

Every letter fits the producer's ``message.max.bytes`` and the dead-letter topic's
``max.message.bytes`` (:func:`max_message_bytes`): one that would not (a record near
the limit plus the ``dlq_*`` headers) keeps its ``dlq_*`` headers, drops the original
headers and cuts the key and value to what fits, saying so in ``dlq_truncated`` with the
original sizes and ``dlq_value_sha256``; the whole original stays at the coordinates the
letter names.  Every producer of dead letters (projector, recovery, resume) sends them
through :func:`send_dead_letters`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from stepledger import wire
from stepledger.config import Settings
from stepledger.kafka import DurableProducer, Headers, Position
from stepledger.kafka.topics import topic_max_message_bytes

TRUNCATED = "truncated"
#: librdkafka's default ``message.max.bytes``.
DEFAULT_MAX_BYTES = 1_000_000
#: Room left for the record's own framing (lengths, attributes, timestamp deltas).
_FRAMING = 1024
_KEY_KEPT = 1024


@dataclass(frozen=True)
class DeadLetter:
    """A record refused by a stage, with where it came from and why."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    origin: Position | None
    stage: str
    error: str
    group: str = ""

    def dlq_headers(self) -> Headers:
        """The ``dlq_*`` headers: the stage, the error and the original's coordinates."""
        extra = {
            "stage": self.stage,
            "error": self.error[:2000],
            "group": self.group,
            "at": datetime.now(UTC).isoformat(),
        }
        if self.origin is not None:
            extra |= {
                "topic": self.origin.topic,
                "partition": str(self.origin.partition),
                "offset": str(self.origin.offset),
            }
        return [(wire.DEAD_LETTER_HEADER_PREFIX + k, v.encode()) for k, v in extra.items()]

    def all_headers(self) -> Headers:
        """The original headers followed by the ``dlq_*`` headers."""
        return [*self.headers, *self.dlq_headers()]

    def fitted(self, max_bytes: int) -> tuple[bytes | None, bytes | None, Headers]:
        """Key, value and headers of the letter, cut so the record fits ``max_bytes``."""
        headers = self.all_headers()
        budget = max_bytes - _FRAMING
        if _size(self.key) + _size(self.value) + _headers_size(headers) <= budget:
            return self.key, self.value, headers
        key = self.key if _size(self.key) <= _KEY_KEPT else (self.key or b"")[:_KEY_KEPT]
        note = (
            f"value {_size(self.value)} bytes, key {_size(self.key)} bytes, "
            f"{len(self.headers)} original headers ({_headers_size(self.headers)} bytes) "
            "did not fit; the original is at the letter's dlq_topic/partition/offset"
        )
        kept = [
            *self.dlq_headers(),
            (wire.DEAD_LETTER_HEADER_PREFIX + TRUNCATED, note.encode()),
            (
                wire.DEAD_LETTER_HEADER_PREFIX + "value_sha256",
                hashlib.sha256(self.value or b"").hexdigest().encode(),
            ),
        ]
        room = max(0, budget - _size(key) - _headers_size(kept))
        value = None if self.value is None else self.value[:room]
        return key, value, kept


def max_message_bytes(settings: Settings, topic: str | None = None) -> int:
    """The most bytes a record may take: the producer's ``message.max.bytes`` and, for a
    ``topic``, the topic's own ``max.message.bytes`` (read once per process), the smaller.

    Without a topic (or when the topic's limit cannot be read) the producer's alone.
    """
    text = settings.kafka.get("message.max.bytes", "")
    producer = int(text) if text.isdigit() else DEFAULT_MAX_BYTES
    if topic is None:
        return producer
    found = topic_max_message_bytes(settings, topic)
    return producer if found is None else min(producer, found)


def send_dead_letters(
    producer: DurableProducer, settings: Settings, letters: Sequence[DeadLetter]
) -> list[Position]:
    """Append the letters to the dead-letter topic, each cut to fit, and wait for every ack."""
    limit = max_message_bytes(settings, settings.dlq_topic)
    futures = [producer.send(settings.dlq_topic, *x.fitted(limit)) for x in letters]
    return [producer.wait(f) for f in futures]


def publish_dead_letter(
    producer: DurableProducer, settings: Settings, letter: DeadLetter
) -> Position:
    """Append one dead letter durably to the settings' dead-letter topic."""
    return send_dead_letters(producer, settings, [letter])[0]


def dead_letter_info(headers: Headers) -> dict[str, str]:
    """The ``dlq_*`` headers of a dead letter, without the prefix."""
    return {
        k[len(wire.DEAD_LETTER_HEADER_PREFIX) :]: (v or b"").decode(errors="replace")
        for k, v in headers
        if k.startswith(wire.DEAD_LETTER_HEADER_PREFIX)
    }


def original_headers(headers: Headers) -> Headers:
    """A dead letter's headers without the ``dlq_*`` ones (what the original record carried)."""
    return [(k, v) for k, v in headers if not k.startswith(wire.DEAD_LETTER_HEADER_PREFIX)]


def _size(data: bytes | None) -> int:
    return 0 if data is None else len(data)


def _headers_size(headers: Headers) -> int:
    # Each header also costs a few bytes of varint lengths on the wire.
    return sum(len(k.encode()) + _size(v) + 10 for k, v in headers)

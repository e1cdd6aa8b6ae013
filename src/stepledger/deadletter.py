"""The dead-letter topic: nothing is lost on bad input.

A dead letter copies the original key, value and headers and adds ``dlq_*`` headers naming
the original topic, partition, offset, consumer group, the stage that refused it and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from stepledger.config import Settings
from stepledger.kafka import DurableProducer, Headers, Position

HEADER_PREFIX = "dlq_"


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

    def all_headers(self) -> Headers:
        """The original headers followed by the ``dlq_*`` headers."""
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
        return [*self.headers, *((HEADER_PREFIX + k, v.encode()) for k, v in extra.items())]


def dead_letter_info(headers: Headers) -> dict[str, str]:
    """The ``dlq_*`` headers of a dead letter, without the prefix."""
    return {
        k[len(HEADER_PREFIX) :]: v.decode(errors="replace")
        for k, v in headers
        if k.startswith(HEADER_PREFIX)
    }


def original_headers(headers: Headers) -> Headers:
    """A dead letter's headers without the ``dlq_*`` ones (what the original record carried)."""
    return [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]


def publish_dead_letter(
    producer: DurableProducer, settings: Settings, letter: DeadLetter
) -> Position:
    """Append a dead letter durably to the settings' dead-letter topic."""
    return producer.append(
        settings.dlq_topic, letter.key or b"", letter.value or b"", letter.all_headers()
    )

"""Where recovery sends steps it gave up on: the dead-letter topic, or a list in memory."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.letter import DeadLetter, publish_dead_letter
from stepledger.domain.events import Event
from stepledger.kafka import DurableProducer
from stepledger.log import event_headers

STAGE = "recovery"


class EventLetterSink(Protocol):
    """Receives the abandonment of every step whose recovery attempts ran out."""

    def publish(self, event: Event, *, reason: str) -> None:
        """Record one given-up step durably."""
        ...

    def close(self) -> None:
        """Release the sink's resources (a sink that holds none does nothing)."""
        ...


class KafkaEventLetters:
    """Dead letters on the settings' dead-letter topic: the event, encoded as on the log.

    ``stage`` names who gave up (``recovery`` for an exhausted step, ``resume`` for a
    workflow past its resumption limit).
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        *,
        producer: DurableProducer | None = None,
        group: str = "",
        stage: str = STAGE,
    ) -> None:
        self.settings = settings
        self.codec = codec
        self.group = group
        self.stage = stage
        # Made on first use: most processes never dead-letter anything.
        self._producer = producer

    def publish(self, event: Event, *, reason: str) -> None:
        """Append the event to the dead-letter topic with ``dlq_*`` headers, durably."""
        if self._producer is None:
            self._producer = DurableProducer(self.settings)
        letter = DeadLetter(
            key=event.workflow_id.encode(),
            value=self.codec.encode(event),
            headers=event_headers(event),
            origin=None,
            stage=self.stage,
            error=reason,
            group=self.group,
        )
        publish_dead_letter(self._producer, self.settings, letter)

    def close(self) -> None:
        """Flush and close the producer, if one was made."""
        if self._producer is not None:
            self._producer.close()


@dataclass(frozen=True)
class GivenUp:
    """One dead letter held in memory."""

    event: Event
    reason: str


class MemoryEventLetters:
    """Dead letters in a list, for tests."""

    def __init__(self) -> None:
        self.letters: list[GivenUp] = []
        self._lock = threading.Lock()

    def publish(self, event: Event, *, reason: str) -> None:
        """Keep the abandonment and why."""
        with self._lock:
            self.letters.append(GivenUp(event, reason))

    def close(self) -> None:
        """Nothing to release."""

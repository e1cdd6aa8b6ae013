"""Where a consumer's refused records go: the dead-letter topic, or a list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from stepledger.config import Settings
from stepledger.deadletters.letter import DeadLetter, send_dead_letters
from stepledger.kafka import DurableProducer


class RecordLetterSink(Protocol):
    """Where refused records go; ``publish`` returns only when every letter is durable."""

    def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Publish the letters and wait until each one is acknowledged."""
        ...

    def close(self) -> None:
        """Release the sink's resources (a sink that holds none does nothing)."""
        ...


class KafkaRecordLetters:
    """Dead letters on the settings' dead-letter topic, each acknowledged before returning."""

    def __init__(self, settings: Settings, producer: DurableProducer | None = None) -> None:
        self._settings = settings
        self._producer = producer or DurableProducer(settings)

    def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Send every letter (cut to fit if needed), then wait for each one's acknowledgement."""
        send_dead_letters(self._producer, self._settings, letters)

    def close(self) -> None:
        """Flush and close the producer."""
        self._producer.close()


@dataclass
class MemoryRecordLetters:
    """Dead letters kept in a list (for tests, and for a rebuild that must not re-publish)."""

    letters: list[DeadLetter] = field(default_factory=list)

    def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Keep the letters."""
        self.letters.extend(letters)

    def close(self) -> None:
        """Nothing to release."""

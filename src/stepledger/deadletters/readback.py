"""Reading the dead-letter topic back, and replaying letters onto their original topic."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.consume import read_topic
from stepledger.deadletters.letter import TRUNCATED, dead_letter_info, original_headers
from stepledger.errors import ConfigError
from stepledger.kafka import DurableProducer, Headers, Position


@dataclass(frozen=True)
class StoredLetter:
    """One record of the dead-letter topic: where it sits, what it carried, and why."""

    position: Position
    key: bytes | None
    value: bytes | None
    headers: Headers
    info: dict[str, str]

    @property
    def origin_topic(self) -> str | None:
        """The topic the refused record was read from."""
        return self.info.get("topic")

    def summary(self) -> dict[str, object]:
        """A JSON-friendly description (the value as its length, never its bytes)."""
        return {
            "dlq_partition": self.position.partition,
            "dlq_offset": self.position.offset,
            "topic": self.info.get("topic"),
            "partition": _int_or_none(self.info.get("partition")),
            "offset": _int_or_none(self.info.get("offset")),
            "stage": self.info.get("stage"),
            "error": self.info.get("error"),
            "group": self.info.get("group"),
            "at": self.info.get("at"),
            "key": (self.key or b"").decode(errors="replace"),
            "value_bytes": None if self.value is None else len(self.value),
            "truncated": self.info.get(TRUNCATED),
        }


def read_dead_letters(settings: Settings, *, idle_timeout: float = 0.5) -> list[StoredLetter]:
    """Every record of the settings' dead-letter topic, in partition and offset order."""
    letters = [
        StoredLetter(r.position, r.key, r.value, r.headers, dead_letter_info(r.headers))
        for r in read_topic(settings, Codec(), topic=settings.dlq_topic, idle_timeout=idle_timeout)
    ]
    return sorted(letters, key=lambda x: (x.position.partition, x.position.offset))


def select_letters(
    letters: Iterable[StoredLetter],
    *,
    positions: Iterable[tuple[int, int]] = (),
    stage: str | None = None,
    everything: bool = False,
) -> list[StoredLetter]:
    """The letters picked by dead-letter (partition, offset), by stage, or all of them."""
    wanted = set(positions)
    if not wanted and stage is None and not everything:
        raise ConfigError("choose letters with --offset PARTITION:OFFSET, --stage or --all")
    return [
        x
        for x in letters
        if (everything or not wanted or (x.position.partition, x.position.offset) in wanted)
        and (stage is None or x.info.get("stage") == stage)
    ]


def replay_letters(
    settings: Settings, letters: list[StoredLetter], *, to_topic: str | None = None
) -> list[Position]:
    """Re-append each letter's original key, value and headers and wait for every ack.

    A null key or value is appended null and a header without a value keeps none.  A letter
    cut to fit the dead-letter topic is refused (its original is at its coordinates).
    """
    cut = [x for x in letters if TRUNCATED in x.info]
    if cut:
        where = ", ".join(f"{x.position.partition}:{x.position.offset}" for x in cut)
        raise ConfigError(
            f"dead letter(s) {where} were cut to fit the dead-letter topic and cannot be "
            "replayed; their originals are at the topic/partition/offset `dlq list --json` shows"
        )
    producer = DurableProducer(settings)
    try:
        futures = [
            producer.send(
                to_topic or x.origin_topic or settings.topic,
                x.key,
                x.value,
                original_headers(x.headers),
            )
            for x in letters
        ]
        return [producer.wait(f) for f in futures]
    finally:
        producer.close()


def parse_position(text: str) -> tuple[int, int]:
    """Parse ``PARTITION:OFFSET`` (a dead letter's own position)."""
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise ConfigError(f"expected PARTITION:OFFSET, got {text!r}")
    return int(partition), int(offset)


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None

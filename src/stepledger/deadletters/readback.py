"""Reading the dead-letter topic back, and replaying letters onto their original topic.

A replay cannot amplify.  Each replayed record carries ``dlq_replay_of`` (the dead-letter
topic, partition and offset of the letter it came from), so a replayed record refused again
makes a letter that says it is *a letter of a replay*; and once a letter's replay is
acknowledged, a marker (``dlq_replayed``) is appended to the dead-letter topic beside it.
A replay then skips every letter already replayed (replaying the same letters twice is a
no-op) and, unless it names them by position, every letter of a replay: a record that is
still poison is replayed at most once per person who asks for it, never 1, 2, 4, 8 times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from stepledger import wire
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.letter import (
    TRUNCATED,
    dead_letter_info,
    original_headers,
)
from stepledger.errors import ConfigError
from stepledger.kafka import DurableProducer, Headers, Position
from stepledger.kafka.reader import read_topic


@dataclass(frozen=True)
class StoredLetter:
    """One record of the dead-letter topic: where it sits, what it carried, and why."""

    position: Position
    key: bytes | None
    value: bytes | None
    headers: Headers
    info: dict[str, str]
    #: Where this letter's replay landed (``topic[partition]@offset``), if it was replayed.
    replayed_to: str | None = None

    @property
    def origin_topic(self) -> str | None:
        """The topic the refused record was read from."""
        return self.info.get("topic")

    @property
    def replay_of(self) -> str | None:
        """The letter whose replay this letter's record was (``dlq_replay_of``), if any."""
        return self.info.get(REPLAY_OF)

    @property
    def name(self) -> str:
        """The letter's own position, ``PARTITION:OFFSET``."""
        return f"{self.position.partition}:{self.position.offset}"

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
            "replay_of": self.replay_of,
            "replayed_to": self.replayed_to,
        }


#: On a replayed record: ``DLQ_TOPIC:PARTITION:OFFSET`` of the letter it was replayed from.
REPLAY_OF = "replay_of"
#: On a marker in the dead-letter topic: ``PARTITION:OFFSET`` of the letter replayed.
REPLAYED = "replayed"
#: On a marker: where the replay landed, ``TOPIC[PARTITION]@OFFSET``.
REPLAYED_TO = "replayed_to"


@dataclass(frozen=True)
class ReplayPlan:
    """The letters a replay sends, and those it skips and why."""

    replay: list[StoredLetter] = field(default_factory=list)
    #: Replayed before: a second replay of them is a no-op.
    already_replayed: list[StoredLetter] = field(default_factory=list)
    #: Letters of a replayed record refused again, not named by position.
    of_replays: list[StoredLetter] = field(default_factory=list)


def plan_replay(
    selected: Sequence[StoredLetter], *, named: Iterable[tuple[int, int]] = ()
) -> ReplayPlan:
    """Split selected letters into those to replay and those a replay must skip.

    A letter already replayed is always skipped; a letter of a replay only when it was not
    named by its position (``--offset``), so a person can still replay one deliberately.
    """
    wanted = set(named)
    plan = ReplayPlan()
    for letter in selected:
        if letter.replayed_to is not None:
            plan.already_replayed.append(letter)
        elif letter.replay_of is not None and (
            (letter.position.partition, letter.position.offset) not in wanted
        ):
            plan.of_replays.append(letter)
        else:
            plan.replay.append(letter)
    return plan


def read_dead_letters(settings: Settings, *, idle_timeout: float = 0.5) -> list[StoredLetter]:
    """Every letter of the settings' dead-letter topic, in partition and offset order.

    Replay markers are not letters: each one sets ``replayed_to`` on the letter it names.
    """
    letters: list[StoredLetter] = []
    replayed: dict[tuple[int, int], str] = {}
    for r in read_topic(settings, Codec(), topic=settings.dlq_topic, idle_timeout=idle_timeout):
        info = dead_letter_info(r.headers)
        if REPLAYED in info:
            # A marker naming no position marks nothing.
            with contextlib.suppress(ConfigError):
                replayed[parse_position(info[REPLAYED])] = info.get(REPLAYED_TO, "?")
            continue
        letters.append(StoredLetter(r.position, r.key, r.value, r.headers, info))
    marked = [
        x
        if (at := replayed.get((x.position.partition, x.position.offset))) is None
        else StoredLetter(x.position, x.key, x.value, x.headers, x.info, replayed_to=at)
        for x in letters
    ]
    return sorted(marked, key=lambda x: (x.position.partition, x.position.offset))


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
                [*original_headers(x.headers), _replay_header(settings, x)],
            )
            for x in letters
        ]
        landed = [producer.wait(f) for f in futures]
        # Marked only once every replay is acknowledged: a crash in between replays the
        # letters again next time (a duplicate event is applied once), never loses one.
        markers = [
            producer.send(settings.dlq_topic, x.key, b"", _marker_headers(x, at))
            for x, at in zip(letters, landed, strict=True)
        ]
        for marker in markers:
            producer.wait(marker)
        return landed
    finally:
        producer.close()


def _replay_header(settings: Settings, letter: StoredLetter) -> tuple[str, bytes]:
    where = f"{settings.dlq_topic}:{letter.position.partition}:{letter.position.offset}"
    return wire.DEAD_LETTER_HEADER_PREFIX + REPLAY_OF, where.encode()


def _marker_headers(letter: StoredLetter, landed: Position) -> Headers:
    values = {
        REPLAYED: letter.name,
        REPLAYED_TO: f"{landed.topic}[{landed.partition}]@{landed.offset}",
        "stage": wire.DEAD_LETTER_REPLAY_STAGE,
        "at": datetime.now(UTC).isoformat(),
    }
    return [(wire.DEAD_LETTER_HEADER_PREFIX + k, v.encode()) for k, v in values.items()]


def parse_position(text: str) -> tuple[int, int]:
    """Parse ``PARTITION:OFFSET`` (a dead letter's own position)."""
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise ConfigError(f"expected PARTITION:OFFSET, got {text!r}")
    return int(partition), int(offset)


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None

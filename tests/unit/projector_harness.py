"""Feeding events to the projector engine without a broker: encoded records, random batches."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from stepledger.codec import Codec
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.domain import events as ev
from stepledger.kafka.records import Consumed
from stepledger.projector.engine import Projector
from stepledger.projector.schema import TABLES
from stepledger.projector.store import ProjectionStore

CODEC = Codec()


def to_messages(
    events: Sequence[ev.Event], *, topic: str = "log", partitions: int = 3
) -> list[Consumed]:
    """Encode events into records keyed by workflow, partitioned like a producer would."""
    offsets = [0] * partitions
    out = []
    for event in events:
        p = zlib.crc32(event.workflow_id.encode()) % partitions
        out.append(record(topic, p, offsets[p], CODEC.encode(event), event.workflow_id.encode()))
        offsets[p] += 1
    return out


def record(
    topic: str, partition: int, offset: int, value: bytes | None, key: bytes = b"k"
) -> Consumed:
    """One consumed record, as the Kafka package hands it over."""
    return Consumed(topic, partition, offset, key, value, [("ce_type", b"x")])


def batches(messages: list[Consumed], rng: random.Random, largest: int) -> Iterator[list[Consumed]]:
    """The messages in consecutive batches of random sizes."""
    i = 0
    while i < len(messages):
        size = rng.randint(1, largest)
        yield messages[i : i + size]
        i += size


def project(
    path: Path,
    messages: list[Consumed],
    *,
    seed: int = 0,
    largest_batch: int = 50,
    cache: int = 1000,
    letters: MemoryRecordLetters | None = None,
) -> MemoryRecordLetters:
    """Project the messages into a fresh or existing file in random batches; return the letters."""
    letters = letters if letters is not None else MemoryRecordLetters()
    rng = random.Random(seed)
    with ProjectionStore(path) as store:
        projector = Projector(store, CODEC, letters, cache_workflows=cache)
        for batch in batches(messages, rng, largest_batch):
            projector.process(batch)
    return letters


def table_contents(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every projected table's rows, sorted, for comparing two builds."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()

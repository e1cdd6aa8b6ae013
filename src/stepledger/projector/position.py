"""Checking, on assignment, that the log still holds what the stored offsets say was read.

A topic deleted and re-created, or a dev broker restarted empty, leaves the projection's
stored offsets ahead of the log (or pointing into a different log).  Seeking there would
skip every new record below the stored offset without a word: Apache Kafka answers the
fetch with "offset out of range" and the consumer resets to the start, where the projector
takes the records for already projected; Tansu answers with nothing at all.

So before seeking, the projector reads back the last event it projected from each
partition (or the record just below the stored offset when it projected none there): out
of range, or no such record, means the log is behind; a record whose bytes differ from the
stored event means the log was replaced.  Either
stops the projector with one line naming ``stepledger rebuild``.  Where the fetch gives no
answer in time (Tansu does not report out-of-range), the partition's end from ListOffsets
decides; Tansu can under-report that end, but only a fetch that found nothing asks it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import ViewStoreError
from stepledger.kafka.client import Consumer, KafkaError, KafkaException, TopicPartition
from stepledger.kafka.consumer import assigned_consumer

Offsets = dict[tuple[str, int], int]
#: The offset and value of the last event projected from (topic, partition) below an offset.
LastEvent = Callable[[str, int, int], tuple[int, bytes] | None]


class LogBehindError(ViewStoreError):
    """The stored offsets are ahead of the log, or the log at them is not the one projected."""


def check_positions(
    settings: Settings,
    wanted: Offsets,
    last_event: LastEvent,
    *,
    db: str,
    timeout: float = 5.0,
    settle_s: float = 20.0,
) -> None:
    """Raise LogBehindError unless each partition still holds the last record projected from it."""
    expected: dict[tuple[str, int], bytes | None] = {}
    probes: Offsets = {}
    for (topic, partition), offset in wanted.items():
        if offset <= 0:
            continue
        found = last_event(topic, partition, offset)
        probes[(topic, partition)] = offset if found is None else found[0] + 1
        expected[(topic, partition)] = None if found is None else found[1]
    if not probes:
        return
    starts = [TopicPartition(t, p, n - 1) for (t, p), n in probes.items()]
    conf = {"auto.offset.reset": "error"}
    with assigned_consumer(
        settings, starts, group=settings.group(wire.POSITION_CHECK_ROLE), **conf
    ) as consumer:
        answers = _probe(consumer, probes, timeout)
        for where, offset in probes.items():
            problem = _verdict(consumer, offset, answers.get(where), expected[where], where)
            if problem is not None and answers.get(where) is None:
                # No answer, and the end looks short: during a leader change the new leader's
                # high watermark lags for a moment.  Only an end that stays short counts.
                problem = _still_short(consumer, where, offset, settle_s)
            if problem is not None:
                topic, partition = where
                raise LogBehindError(
                    f"{topic}[{partition}] {problem}, but {db} projected it up to offset "
                    f"{wanted[where]}: the topic was re-created or the broker restarted empty; "
                    f"rebuild the projection with `stepledger rebuild --db {db} --force`"
                )


_Answer = tuple[str, bytes | None]


def _probe(consumer: Consumer, probes: Offsets, timeout: float) -> dict[tuple[str, int], _Answer]:
    """Per partition: ("record", value), ("out_of_range", None) or ("end", None)."""
    answers: dict[tuple[str, int], _Answer] = {}
    deadline = time.monotonic() + timeout
    while len(answers) < len(probes) and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        where = (str(msg.topic()), int(msg.partition() or 0))
        if where not in probes or where in answers:
            continue
        err = msg.error()
        if err is None:
            if int(msg.offset() or 0) == probes[where] - 1:
                answers[where] = ("record", msg.value())
        elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            answers[where] = ("out_of_range", None)
        elif err.code() == KafkaError._PARTITION_EOF and int(msg.offset() or 0) < probes[where]:
            answers[where] = ("end", None)
    return answers


def _verdict(
    consumer: Consumer,
    offset: int,
    answer: _Answer | None,
    stored: bytes | None,
    where: tuple[str, int],
) -> str | None:
    """Why the partition cannot be what was projected (None: it is), probed at offset - 1."""
    topic, partition = where
    if answer is None:
        high = _high_watermark(consumer, topic, partition)
        return None if high is None or high >= offset else f"ends at offset {high}"
    kind, value = answer
    if kind != "record":
        return f"has no record at offset {offset - 1}"
    if stored is not None and stored != (value or b""):
        return f"holds a different record at offset {offset - 1}"
    return None


def _still_short(
    consumer: Consumer, where: tuple[str, int], offset: int, settle_s: float
) -> str | None:
    """Ask the partition's end again for ``settle_s``; a problem only if it stays short."""
    topic, partition = where
    deadline = time.monotonic() + settle_s
    high: int | None = None
    while time.monotonic() < deadline:
        time.sleep(1.0)  # the broker's metadata moves on its own clock: nothing to poll
        high = _high_watermark(consumer, topic, partition)
        if high is None or high >= offset:
            return None
    return f"ends at offset {high}"


def _high_watermark(consumer: Consumer, topic: str, partition: int) -> int | None:
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5.0)
    except KafkaException:
        return None
    return int(high) if high >= 0 else None

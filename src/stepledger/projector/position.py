"""Checking, on assignment, that the log still holds what the stored offsets say was read.

A topic deleted and re-created, or a dev broker restarted empty, leaves the projection's
stored offsets ahead of the log (or pointing into a different log).  Seeking there would
skip every new record below the stored offset without a word: Apache Kafka answers the
fetch with "offset out of range" and the consumer resets to the start, where the projector
takes the records for already projected; Tansu answers nothing.

So before seeking, the projector reads back the last event it projected from each
partition (or the record just below the stored offset when it projected none there): out
of range, or no such record, means the log is behind; a record whose bytes differ from the
stored event means the log was replaced.  Either
stops the projector with one line naming ``stepledger rebuild``.  Where the fetch gives no
answer in time (Tansu), the partition's end from ListOffsets decides, asked only then.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import BrokerError, ViewStoreError
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import Where

Offsets = dict[Where, int]
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
    conf = {"auto.offset.reset": "error"}
    group = settings.group(wire.POSITION_CHECK_ROLE)
    with PartitionReader(
        settings, group=group, fetch_wait_ms=50, grows=False, failure=_retried, **conf
    ) as reader:
        answers = _probe(reader, probes, timeout)
        for where, offset in probes.items():
            problem = _verdict(reader, offset, answers.get(where), expected[where], where)
            if problem is not None and answers.get(where) is None:
                # No answer, and the end looks short: during a leader change the new leader's
                # high watermark lags for a moment.  Only an end that stays short counts.
                problem = _still_short(reader, where, offset, settle_s)
            if problem is not None:
                topic, partition = where
                raise LogBehindError(
                    f"{topic}[{partition}] {problem}, but {db} projected it up to offset "
                    f"{wanted[where]}: the topic was re-created or the broker restarted empty; "
                    f"rebuild the projection with `stepledger rebuild --db {db} --force`"
                )


_Answer = tuple[str, bytes | None]


def _retried(err: object) -> None:
    """Every consumer error but an end or an offset out of range is left to the client."""
    return None


def _probe(reader: PartitionReader, probes: Offsets, timeout: float) -> dict[Where, _Answer]:
    """Per partition: ("record", value), ("out_of_range", None) or ("end", None)."""
    answers: dict[Where, _Answer] = {}
    starts = {where: n - 1 for where, n in probes.items()}

    def answered() -> bool:
        return len(answers) == len(probes)

    for batch in reader.follow(starts, within=timeout, stop=answered, wait_s=0.1, prompt=True):
        for record in batch.records:
            where = (record.topic, record.partition)
            if where in probes and where not in answers and record.offset == probes[where] - 1:
                answers[where] = ("record", record.value)
        for where in batch.out_of_range:
            if where in probes:
                answers.setdefault(where, ("out_of_range", None))
        for where, end in batch.at_end.items():
            if where in probes and end < probes[where]:
                answers.setdefault(where, ("end", None))
    return answers


def _verdict(
    reader: PartitionReader,
    offset: int,
    answer: _Answer | None,
    stored: bytes | None,
    where: Where,
) -> str | None:
    """Why the partition cannot be what was projected (None: it is), probed at offset - 1."""
    if answer is None:
        high = _high_watermark(reader, where)
        return None if high is None or high >= offset else f"ends at offset {high}"
    kind, value = answer
    if kind != "record":
        return f"has no record at offset {offset - 1}"
    if stored is not None and stored != (value or b""):
        return f"holds a different record at offset {offset - 1}"
    return None


def _still_short(reader: PartitionReader, where: Where, offset: int, settle_s: float) -> str | None:
    """Ask the partition's end again for ``settle_s``; a problem only if it stays short."""
    deadline = time.monotonic() + settle_s
    high: int | None = None
    while time.monotonic() < deadline:
        time.sleep(1.0)  # the broker's metadata moves on its own clock: nothing to poll
        high = _high_watermark(reader, where)
        if high is None or high >= offset:
            return None
    return f"ends at offset {high}"


def _high_watermark(reader: PartitionReader, where: Where) -> int | None:
    try:
        _, high = reader.watermarks(where)
    except BrokerError:
        return None
    return high if high >= 0 else None

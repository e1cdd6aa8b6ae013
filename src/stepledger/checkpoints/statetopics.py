"""The state topics as a whole: whose records they hold, and naming those of an upgrade.

A state topic (the checkpoint topic, the recovery changelog) holds, per key, the newest
record of one deployment's state; since 0.4.0 each record names its step log
(:mod:`stepledger.kafka.logid`).  Two operations read such a topic whole, outside any daemon:

- :func:`origins`: whose records the newest ones of each partition are (``stepledger
  doctor`` reports a topic shared with another step log, or holding records naming none);
- :func:`adopt_unnamed`: the upgrade from 0.3.0 (``stepledger init --adopt-unnamed-state``).
  Records written before 0.4.0 name no step log, and every reader refuses them.  For each
  key whose newest record names none and whose own fields name this step log's topic, the
  record is written again, unchanged, with this log's identity.  A record naming another
  topic is left alone: up to 0.3.0 one checkpoint topic and one changelog served every
  step log of a cluster by default, so an unnamed record may well be another deployment's.
  Run it once, with no checkpointer and no recovery daemon running (a record written
  again after a daemon's newer one would outlive it under compaction).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.record import decode
from stepledger.config import Settings
from stepledger.errors import CodecError
from stepledger.kafka import DurableProducer, Headers, Position, topic_partitions
from stepledger.kafka.gaps import LogStart
from stepledger.kafka.logid import LogIdentity, Origin, named_in, stamped
from stepledger.kafka.reader import records_to_end
from stepledger.kafka.records import Consumed

#: Reading a state topic never takes longer than this.
READ_LIMIT_S = 120.0
#: Whether a record (key, value) of a state topic describes the given step-log topic.
Belongs = Callable[[bytes, bytes, str], bool]


def records(settings: Settings, topic: str, *, last: int | None = None) -> Iterator[Consumed]:
    """Every record of the topic's partitions to their ends (the newest ``last`` of each)."""
    ends = LogStart(settings)
    try:
        starts = {}
        for partition in topic_partitions(settings, topic):
            low = ends.of(topic, partition)
            high = ends.end(topic, partition)
            starts[(topic, partition)] = low if last is None else max(low, high - last)
    finally:
        ends.close()
    group = settings.group(wire.STATE_ADOPTION_ROLE)
    for batch in records_to_end(settings, starts, group=group, within=READ_LIMIT_S):
        yield from batch


def origins(settings: Settings, topic: str, *, last: int | None = 1000) -> Counter[str]:
    """Per step log named (``-``: none), how many of the newest ``last`` records of each
    partition of a state topic name it (None: all of them)."""
    return Counter(named_in(r.headers) or "-" for r in records(settings, topic, last=last))


def adopt_unnamed(settings: Settings, identity: LogIdentity, topic: str, belongs: Belongs) -> int:
    """Write again, naming ``identity``, the newest record of every key of ``topic`` that
    names no step log and belongs to this one; return how many (see the module doc)."""
    newest: dict[tuple[int, bytes], Consumed] = {}
    for record in records(settings, topic):
        newest[(record.partition, record.key or b"")] = record
    adopted = [
        record
        for record in newest.values()
        if record.value is not None
        and identity.origin(record.headers) is Origin.UNNAMED
        and belongs(record.key or b"", record.value, identity.topic)
    ]
    producer = DurableProducer(settings)
    try:
        futures = [
            producer.send(
                topic,
                record.key,
                record.value,
                # The directory pointer named a root of the old records: dropped, so a
                # reader reads the partition until the checkpointer writes a directory.
                stamped(identity, _without_pointer(record)),
                partition=record.partition,
            )
            for record in sorted(adopted, key=lambda r: (r.partition, r.offset))
        ]
        done: list[Position] = [producer.wait(future) for future in futures]
    finally:
        producer.close()
    return len(done)


def _without_pointer(record: Consumed) -> Headers:
    return [(n, v) for n, v in record.headers if n != wire.CHECKPOINT_DIRECTORY_HEADER]


def checkpoint_of(key: bytes, value: bytes, step_log: str) -> bool:
    """A checkpoint or progress record folded from ``step_log`` (directories are rewritten
    by the checkpointer, never adopted)."""
    if dirs.is_directory_key(key):
        return False
    try:
        return decode(value).topic == step_log
    except CodecError:
        return False


def changelog_of(key: bytes, value: bytes, step_log: str) -> bool:
    """A recovery changelog record of ``step_log`` (its key names the topic third)."""
    try:
        parsed = json.loads(key)
    except ValueError:
        return False
    return isinstance(parsed, list) and len(parsed) >= 3 and parsed[2] == step_log

"""The state topics as a whole: whose records they hold, and naming those of an upgrade.

A state topic (the checkpoint topic, the recovery changelog) holds, per key, the newest
record of one deployment's state; since 0.4.0 each record names its step log
(:mod:`stepledger.logid`).  Two operations read such a topic whole, outside any daemon:

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
import time
from collections import Counter
from collections.abc import Callable, Iterator

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.record import decode
from stepledger.config import Settings
from stepledger.errors import BrokerError, CodecError
from stepledger.gaps import LogStart
from stepledger.kafka import DurableProducer, Headers, Position, topic_partitions
from stepledger.kafka.client import Message, TopicPartition
from stepledger.kafka.consumer import partition_end, reading_to_end
from stepledger.logid import LogIdentity, Origin, named_in, stamped

#: Reading a state topic never takes longer than this.
READ_LIMIT_S = 120.0
_BATCH = 5000
#: Whether a record (key, value) of a state topic describes the given step-log topic.
Belongs = Callable[[bytes, bytes, str], bool]


def records(settings: Settings, topic: str, *, last: int | None = None) -> Iterator[Message]:
    """Every record of the topic's partitions to their ends (the newest ``last`` of each)."""
    ends = LogStart(settings)
    try:
        starts = []
        for partition in topic_partitions(settings, topic):
            low = ends.of(topic, partition)
            high = ends.end(topic, partition)
            start = low if last is None else max(low, high - last)
            starts.append(TopicPartition(topic, partition, start))
    finally:
        ends.close()
    group = settings.group(wire.STATE_ADOPTION_ROLE)
    deadline = time.monotonic() + READ_LIMIT_S
    ended: set[int] = set()
    with reading_to_end(settings, starts, group=group, fetch_wait_ms=10) as reader:
        while len(ended) < len(starts):
            if time.monotonic() > deadline:
                raise BrokerError(f"could not read {topic} to its end in time")
            for msg in reader.consume(_BATCH, 0.05):
                if partition_end(msg):
                    ended.add(int(msg.partition() or 0))
                    continue
                yield msg


def origins(settings: Settings, topic: str, *, last: int | None = 1000) -> Counter[str]:
    """Per step log named (``-``: none), how many of the newest ``last`` records of each
    partition of a state topic name it (None: all of them)."""
    return Counter(named_in(msg.headers()) or "-" for msg in records(settings, topic, last=last))


def adopt_unnamed(settings: Settings, identity: LogIdentity, topic: str, belongs: Belongs) -> int:
    """Write again, naming ``identity``, the newest record of every key of ``topic`` that
    names no step log and belongs to this one; return how many (see the module doc)."""
    newest: dict[tuple[int, bytes], Message] = {}
    for msg in records(settings, topic):
        newest[(int(msg.partition() or 0), msg.key() or b"")] = msg
    adopted = [
        msg
        for msg in newest.values()
        if msg.value() is not None
        and identity.origin(msg.headers()) is Origin.UNNAMED
        and belongs(msg.key() or b"", msg.value() or b"", identity.topic)
    ]
    producer = DurableProducer(settings)
    try:
        futures = [
            producer.send(
                topic,
                msg.key(),
                msg.value(),
                # The directory pointer named a root of the old records: dropped, so a
                # reader reads the partition until the checkpointer writes a directory.
                stamped(identity, _without_pointer(msg)),
                partition=int(msg.partition() or 0),
            )
            for msg in sorted(adopted, key=lambda m: (m.partition() or 0, m.offset() or 0))
        ]
        done: list[Position] = [producer.wait(future) for future in futures]
    finally:
        producer.close()
    return len(done)


def _without_pointer(msg: Message) -> Headers:
    pairs = msg.headers() or []
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return [
        (n, v.encode() if isinstance(v, str) else v)
        for n, v in items
        if n != wire.CHECKPOINT_DIRECTORY_HEADER
    ]


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

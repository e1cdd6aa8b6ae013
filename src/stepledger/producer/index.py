"""Which workflows a partition holds: an index a reader keeps up to date, read incrementally.

Opening a workflow must know whether its id is already in the log, and where its events
start.  Reading its partition from the beginning on every open costs the partition's size
each time (and a new consumer's round trips); many agents in one process opening short
workflows spend most of their time there.  :class:`PartitionIndex` keeps, per partition,
the offset of each workflow key's first record and how far it has read, so an open reads
only the records written since the previous one (keys only, nothing decoded).

Freshness: every lookup is answered after a catch-up that *began after the lookup was
asked*, and a catch-up ends at a partition-EOF reported by a fetch sent after it began
(a new consumer assigned at the index's offsets), never at a fresh ListOffsets (wrong on
the dev broker).  So
every record acknowledged before the lookup is indexed, as with a full read.  Concurrent
lookups share one catch-up: one thread reads, the others wait for it.  Between catch-ups
nothing is fetched.

Memory is bounded: past ``max_keys`` workflow keys a partition is no longer indexed and its
lookups answer "from the beginning" (a full read of the partition: correct, slower).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, TopicPartition

from stepledger import wire
from stepledger.config import Settings
from stepledger.consume import assigned_consumer
from stepledger.errors import BrokerError

Partition = tuple[str, int]

#: Workflow keys indexed per reader before a partition falls back to full reads (~100 B each).
MAX_KEYS = 250_000
#: A catch-up (or the wait for another thread's) never takes longer than this.
CATCH_UP_LIMIT_S = 120.0
_BATCH = 5000
_POLL_S = 0.01
#: Short fetch waits, as the reader's: the dev broker does not wake a waiting fetch when data
#: arrives (a 1 ms wait was measured to starve a partition under load).
_INDEX_GROUP = wire.WORKFLOW_INDEX_GROUP
_FETCH_WAIT_MS = 10


@dataclass
class Lookup:
    """What the index knows about one workflow key after a catch-up that covered the lookup."""

    partition: Partition
    key: bytes
    first: int | None = None
    """The offset of the key's first record (None: the partition has none)."""
    seen_from: int | None = None
    """Where the covering catch-up started reading: the records below it were not seen."""
    records: list[bytes] = field(default_factory=list)
    """The values of the key's records the covering catch-up read, in log order."""
    done: bool = False

    @property
    def complete(self) -> bool:
        """True when ``records`` hold every record of the key (nothing of it came before)."""
        return self.first is None or (self.seen_from is not None and self.first >= self.seen_from)


class PartitionIndex:
    """The first offset of every workflow key in the partitions a reader was asked about."""

    def __init__(self, settings: Settings, max_keys: int = MAX_KEYS) -> None:
        self.settings = settings
        self.max_keys = max_keys
        self.records = 0
        """Records read by every catch-up so far (what the index cost)."""
        self._cond = threading.Condition()
        self._begun = 0
        self._finished = 0
        self._running = False
        self._wanted: set[Partition] = set()
        self._lookups: list[Lookup] = []
        self._next: dict[Partition, int] = {}
        self._first: dict[Partition, dict[bytes, int]] = {}
        self._overflowed: set[Partition] = set()
        self._keys = 0

    def lookup(self, partition: Partition, key: bytes) -> Lookup:
        """Catch up, then say where the key starts and hand over its records seen meanwhile.

        An unindexed partition (past the key bound) answers ``first=0``, never complete.
        """
        found = Lookup(partition, key)
        self._catch_up(found)
        with self._cond:
            if partition in self._overflowed:
                found.first, found.seen_from = 0, None
            else:
                found.first = self._first.get(partition, {}).get(key)
        return found

    def first_offset(self, partition: Partition, key: bytes) -> int | None:
        """Where the key's records start in the partition (None: it has none; 0 when unindexed)."""
        return self.lookup(partition, key).first

    def close(self) -> None:
        """Forget the index (a catch-up under way finishes on its own)."""
        with self._cond:
            self._first.clear()
            self._next.clear()
            self._overflowed.clear()
            self._keys = 0

    def _catch_up(self, found: Lookup) -> None:
        """Return once a catch-up that began after this call reached the partitions' ends."""
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        with self._cond:
            self._wanted.add(found.partition)
            self._lookups.append(found)
            try:
                while not found.done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BrokerError(f"could not index {self.settings.topic} in time")
                    if self._running:
                        self._cond.wait(min(left, 1.0))
                        continue
                    self._run_one(left)
            finally:
                self._lookups.remove(found)

    def _run_one(self, left: float) -> None:
        """Drive one catch-up of every wanted partition (called holding the lock)."""
        self._running = True
        self._begun += 1
        targets = set(self._wanted)
        covered = [f for f in self._lookups if not f.done]
        for found in covered:
            found.seen_from = self._next.get(found.partition, 0)
            found.records.clear()
        self._cond.release()
        done = False
        try:
            self._scan(targets, covered, left)
            done = True
        finally:
            self._cond.acquire()
            self._running = False
            if done:
                for found in covered:
                    found.done = True
            self._cond.notify_all()

    def _scan(self, targets: set[Partition], covered: list[Lookup], left: float) -> None:
        """Read every target partition from where the index stopped to its end.

        A consumer of its own per catch-up, assigned at the index's offsets: its first
        fetch is sent after the catch-up began, so the end it reports is fresh.  (A
        long-lived consumer paused between catch-ups and sought again was measured to stop
        fetching a partition now and then on the dev broker.)  The records of the keys
        being looked up are kept for their lookups.
        """
        keep: dict[tuple[Partition, bytes], list[Lookup]] = {}
        for found in covered:
            keep.setdefault((found.partition, found.key), []).append(found)
        starts = [TopicPartition(t, p, self._next.get((t, p), 0)) for t, p in targets]
        at_end: set[Partition] = set()
        deadline = time.monotonic() + left
        with assigned_consumer(
            self.settings, starts, group=_INDEX_GROUP, **{"fetch.wait.max.ms": _FETCH_WAIT_MS}
        ) as consumer:
            while len(at_end) < len(targets):
                if time.monotonic() > deadline:
                    raise BrokerError(f"could not reach the end of {self.settings.topic} in time")
                for msg in consumer.consume(_BATCH, _POLL_S):
                    if self._take(msg, at_end) and keep:
                        where = (str(msg.topic()), int(msg.partition() or 0))
                        for found in keep.get((where, msg.key() or b""), ()):
                            found.records.append(msg.value() or b"")

    def _take(self, msg: Message, at_end: set[Partition]) -> bool:
        """Index one record (True), or note a partition's end / skip a stale record (False)."""
        where = (str(msg.topic()), int(msg.partition() or 0))
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                at_end.add(where)
                return False
            raise BrokerError(f"indexing the log failed: {err.str()}")
        offset = int(msg.offset() or 0)
        if offset < self._next.get(where, 0):
            return False  # already indexed
        self._next[where] = offset + 1
        self.records += 1
        if where in self._overflowed:
            return True
        keys = self._first.setdefault(where, {})
        key = msg.key() or b""
        if key not in keys:
            keys[key] = offset
            self._keys += 1
            if self._keys > self.max_keys:
                self._overflow(where)
        return True

    def _overflow(self, where: Partition) -> None:
        self._keys -= len(self._first[where])
        self._first[where] = {}
        self._overflowed.add(where)

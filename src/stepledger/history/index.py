"""The Kafka history's tail index: which workflows a partition holds, read incrementally.

Opening a workflow must know whether its id is already in the log, and where its events
start.  :class:`PartitionIndex` keeps, per partition, the offset of each workflow key's
first record and how far it has read, so an open reads only the records written since the
previous one (keys only, nothing decoded).  What each mechanism below earned, measured, is
in docs/benchmarks.md ("The Kafka history's tail index"); here each keeps its reason.

- Freshness: every lookup is answered after a catch-up that *began after it was asked*; a
  catch-up ends a partition at a partition-EOF from a fetch sent after it began (the
  partitions are assigned afresh), or, on a one-broker cluster, once it has read exactly to
  the high watermark such a fetch reported (``_reached``: under load the EOF comes late);
  never at a fresh ListOffsets (wrong on the dev broker).  Leaders only (``client.rack``
  cleared): a follower's end lags.  Concurrent lookups share one catch-up.
- Bounded lookups: a lookup naming an offset of the key this process had acknowledged
  (``through``) needs no fresh end: it ends once read through that offset, reading on from
  where the consumer is.  After a catch-up the partitions stay assigned and librdkafka
  keeps fetching them (the *tail*): a re-assignment per open costs client CPU.
- The tail is unassigned after ``TAIL_IDLE_S`` without a lookup (an idle partition's
  short fetch waits cost CPU), or at once when a partition runs ``TAIL_AHEAD_RECORDS``
  past the index (fetching each record as it lands slows an agent stepping on after its
  one open).
- Hints: only a tailed partition read from offset 0 (or from where ``begin`` said: a
  caller adds what lies below) answers :meth:`PartitionIndex.unseen`
  (an id it never saw; the keys this process wrote, :meth:`PartitionIndex.wrote`, never
  are) and :meth:`PartitionIndex.tailed` (a key's kept records, when they are its whole
  history); an open acts on them only by claiming first and reading back through its claim.
- One consumer lives as long as the index (a new one per catch-up costs its connection
  each open).  The fetch wait starts short (a catch-up that finds nothing costs about two);
  a catch-up that sees neither a record nor an end for a while takes a five times longer
  wait, up to a plain consumer's ``fetch.wait.max.ms`` (the dev broker answers no fetch
  before its wait when assembling the answer takes longer).
- Kept records: the values of workflows not finished yet (up to ``max_kept_bytes``), with
  their timestamps (a resume judges deadlines on the broker's append times,
  :mod:`stepledger.history.clock`), so opening a workflow the index read past earlier
  needs no second read of its partition.

Memory is bounded: past ``max_keys`` workflow keys a partition is no longer indexed and its
lookups answer "from the beginning" (a full read of the partition: correct, slower); past
``max_kept_bytes`` the kept records are forgotten and kept again from there on.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from dataclasses import dataclass, field

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka.reader import PartitionReader, starved_after
from stepledger.kafka.records import Consumed, Polled, Where

Partition = Where
Stored = tuple[bytes, tuple[int, int]]
"""A record's value and its timestamp as the client gave it (``(type, milliseconds)``)."""

#: Workflow keys indexed per reader before a partition falls back to full reads (~100 B each).
MAX_KEYS = 250_000
#: Bytes of unfinished workflows' records kept for their opens, all partitions together.
MAX_KEPT_BYTES = 32 * 1024 * 1024
#: The event type header of a workflow's last record (its kept records are dropped then).
_FINISHED = b"stepledger.workflow_finished"
#: A catch-up (or the wait for another thread's) never takes longer than this.
CATCH_UP_LIMIT_S = 120.0
_BATCH = 5000
_POLL_S = 0.01
#: The first fetch wait (it grows while starved, up to a plain consumer's): see the module doc.
FIRST_FETCH_WAIT_MS = 2
#: How long asking a partition's log start may take.
_WATERMARK_TIMEOUT_S = 5.0
#: Partitions stay assigned (fetched) this long after the last catch-up, then unassigned.
TAIL_IDLE_S = 1.0
#: ...or sooner (all of them), once one holds more than this many records past where the
#: index has read: the tail serves opens, not an agent stepping on after its own open.
TAIL_AHEAD_RECORDS = 64
#: How often an idle tail is checked.
_REAP_EVERY_S = 0.05
#: Records of its own a process noted per partition before the index reads them.
MAX_NOTES = 16_384
#: At most this many kept records are handed out as a workflow's tailed history.
MAX_TAILED = 256


@dataclass(eq=False)
class Lookup:
    """What the index knows about one workflow key after a catch-up that covered the lookup.

    One caller's request, compared by identity: two runners of one workflow in a process
    look up the same key at once, and a lookup equal by value to another must never be
    taken for it (``list.remove`` took the other one and the second removal raised).
    """

    partition: Partition
    key: bytes
    through: int | None = None
    """An offset of the key's record acknowledged before the lookup: the catch-up may end
    the partition once it has read through it, with no fresh end (None: it may not)."""
    first: int | None = None
    """The offset of the key's first record (None: the partition has none)."""
    seen_from: int | None = None
    """Where the covering catch-up started reading: the records below it were not seen."""
    records: list[Stored] = field(default_factory=list)
    """The key's records the covering catch-up read (values and stamps), in log order."""
    from_zero: bool = False
    """The index has read the partition from offset 0: a record it never saw never existed."""
    done: bool = False

    @property
    def complete(self) -> bool:
        """True when ``records`` hold every record of the key (nothing of it came before)."""
        return self.first is None or (self.seen_from is not None and self.first >= self.seen_from)

    @property
    def whole(self) -> bool:
        """True when ``records`` are the key's whole history, whatever was deleted since.

        The index read the partition from offset 0 and kept every record of the key (or saw
        none: the id never had a record), so a log start moved forward since, by retention or
        ``DeleteRecords``, cannot have taken anything from it.
        """
        return self.from_zero and self.complete


class _Kept:
    """The records of unfinished workflows in one partition, read from ``since`` on."""

    __slots__ = ("since", "values")

    def __init__(self, since: int) -> None:
        self.since = since
        self.values: dict[bytes, list[Stored]] = {}


class PartitionIndex:
    """The first offset of every workflow key in the partitions a reader was asked about."""

    def __init__(
        self, settings: Settings, max_keys: int = MAX_KEYS, max_kept_bytes: int = MAX_KEPT_BYTES
    ) -> None:
        self.settings = settings
        self.max_keys = max_keys
        self.max_kept_bytes = max_kept_bytes
        self.records = 0
        """Records read by every catch-up so far (what the index cost)."""
        self.watermark_ends = 0
        """Partitions a catch-up ended at the fetched high watermark, before their end event."""
        self.catch_ups = 0
        """Catch-ups begun (concurrent lookups share one)."""
        self.assignments = 0
        """Times the partitions were assigned afresh (a catch-up reading the tail assigns none)."""
        self._one_broker = False
        """The cluster had one broker when the consumer was made: the watermark end holds."""
        self._cond = threading.Condition()
        self._finished = 0
        self._running = False
        self._lookups: list[Lookup] = []
        self._next: dict[Partition, int] = {}
        self._began: dict[Partition, int] = {}
        """Where the index began reading each partition (its log start then), when known."""
        self._first: dict[Partition, dict[bytes, int]] = {}
        self._overflowed: set[Partition] = set()
        self._keys = 0
        self.fetch_wait_ms = FIRST_FETCH_WAIT_MS
        """The index consumer's fetch wait (grows when the broker cannot answer within it)."""
        self._reader: PartitionReader | None = None
        self._tailing: set[Partition] = set()
        """The partitions the reader has assigned (fetched) now."""
        self._current: set[Partition] = set()
        """Tailed partitions a catch-up has completed since they were assigned (the hints
        answer only for these: mid-read, the index does not know the ids below its end)."""
        self._last_used = -math.inf
        self._reaper: threading.Thread | None = None
        self._closing = False
        self._kept: dict[Partition, _Kept] = {}
        self._kept_bytes = 0
        self._vouched: dict[Partition, int] = {}
        """Where :meth:`begin` started a partition (the checkpoint directory vouches below)."""
        self._written: dict[Partition, dict[bytes, int]] = {}
        """Keys this process recorded past where the index has read (never :meth:`unseen`),
        with their offsets; a catch-up drops the ones it read."""
        self._kept_lock = threading.Lock()

    def lookup(self, partition: Partition, key: bytes, through: int | None = None) -> Lookup:
        """Catch up, then say where the key starts and hand over its records seen meanwhile.

        ``through``: an acknowledged offset of the key's record; the catch-up reads through
        it instead of to a fresh end (see the module doc).  An unindexed partition (past the
        key bound) answers ``first=0``, never complete.
        """
        found = Lookup(partition, key, through)
        self._catch_up(found)
        return self._answer(found)

    def _answer(self, found: Lookup) -> Lookup:
        """Fill in where the key starts, from the index after the lookup's catch-up."""
        partition = found.partition
        with self._cond:
            if partition in self._overflowed:
                found.first, found.seen_from = 0, None
            else:
                found.from_zero = self._began.get(partition) == 0
                found.first = self._first.get(partition, {}).get(found.key)
                if not found.complete:
                    self._hand_kept(found)
        return found

    def _hand_kept(self, found: Lookup) -> None:
        """Give a lookup the key's kept records when they are all of its records."""
        with self._kept_lock:
            kept = self._kept.get(found.partition)
            if kept is None or found.first is None or found.first < kept.since:
                return
            values = kept.values.get(found.key)
            if values is not None:
                found.records, found.seen_from = list(values), kept.since

    @property
    def tailing(self) -> frozenset[Partition]:
        """The partitions assigned now (fetched between catch-ups until idle or run ahead)."""
        with self._cond:
            return frozenset(self._tailing)

    def unseen(self, partition: Partition, key: bytes) -> bool:
        """True when the key has no record below where the index is tailing the partition.

        No round trip: the partition is being tailed (a catch-up ended within
        ``TAIL_IDLE_S`` and the tail has not run ``TAIL_AHEAD_RECORDS`` ahead), the index
        read it from offset 0 and never saw the key, and this process noted no record of it
        (:meth:`wrote`).  A record of the key may still have
        landed since; a caller acting on this must read back through its own record
        (``lookup(..., through=)``) before it counts on it.  A hint, so it takes no lock a
        catch-up holds (an event loop asks it): each read is one dict or set lookup.
        """
        if not self._followed(partition) or key in self._first.get(partition, {}):
            return False
        with self._kept_lock:
            return key not in self._written.get(partition, {})

    def _followed(self, partition: Partition) -> bool:
        """True when the hints may answer for the partition: tailed, caught up since it was
        assigned, read from offset 0 (or from where :meth:`begin` said) and still indexed."""
        return (
            partition in self._current
            and self._began.get(partition) == self._vouched.get(partition, 0)
            and partition not in self._overflowed
        )

    def wrote(self, partition: Partition, key: bytes, offset: int) -> None:
        """Note a record this process wrote (a claim, an end): its key is neither
        :meth:`unseen` nor :meth:`tailed` until a catch-up has read it.

        Past ``MAX_NOTES`` notes not read yet in a partition, the partition loses its proof
        from offset 0 (no id of it is unseen from then on; its reads stay correct).
        """
        if offset < self._next.get(partition, 0):
            return  # read already
        with self._kept_lock:
            written = self._written.setdefault(partition, {})
            written.setdefault(key, offset)
            if len(written) > MAX_NOTES:
                self._written.pop(partition)
                self._began.pop(partition, None)

    def tailed(self, partition: Partition, key: bytes) -> list[bytes] | None:
        """The key's records as the tail last read them, when they are its whole history.

        No round trip, no lock a catch-up holds: the partition is being tailed, was read
        from offset 0, every record of the key was kept, this process wrote none the
        index has not read, and there are at most ``MAX_TAILED`` (an event loop decodes
        them).  A hint, as :meth:`unseen` is: records may have landed since; None when the
        index cannot say.
        """
        first = self._first.get(partition, {}).get(key)
        if first is None or not self._followed(partition):
            return None
        with self._kept_lock:
            if key in self._written.get(partition, {}):
                return None
            kept = self._kept.get(partition)
            if kept is None or first < kept.since:
                return None
            values = kept.values.get(key)
            return None if values is None or len(values) > MAX_TAILED else [v for v, _ in values]

    def begin(self, partition: Partition, offset: int) -> bool:
        """Read a partition never read from ``offset`` on (not its log start): the checkpoint
        directory vouches for what lies below.  False: the partition was read already.

        The hints then answer for what the index read from ``offset`` on: a caller combines
        them with what lies below (the workflow's checkpoint).
        """
        with self._cond:
            if partition in self._next or partition in self._began or partition in self._tailing:
                return False
            self._began[partition] = self._next[partition] = self._vouched[partition] = offset
            return True

    def began(self, partition: Partition) -> int | None:
        """Where the index began reading the partition, while it read every offset since
        (None: not known, or offsets were skipped since: a head deleted under it)."""
        with self._cond:
            return self._began.get(partition)

    def read_to(self, partition: Partition) -> int | None:
        """The last offset of the partition the index has read (None: none yet)."""
        with self._cond:
            following = self._next.get(partition)
        return None if following is None else following - 1

    def first_offset(self, partition: Partition, key: bytes) -> int | None:
        """Where the key's records start in the partition (None: it has none; 0 when unindexed)."""
        return self.lookup(partition, key).first

    def close(self) -> None:
        """Forget the index and close its consumer (a catch-up under way closes it at its end)."""
        with self._cond:
            self._first.clear()
            self._next.clear()
            self._began.clear()
            self._vouched.clear()
            self._overflowed.clear()
            self._keys = 0
            with self._kept_lock:
                self._kept.clear()
                self._kept_bytes = 0
                self._written.clear()
            if self._running:
                self._closing = True
            else:
                self._drop_reader()

    def _catch_up(self, found: Lookup) -> None:
        """Return once a catch-up that began after this call reached the partitions' ends."""
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        with self._cond:
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
        """Drive one catch-up of the waiting lookups' partitions (called holding the lock)."""
        self._running = True
        self.catch_ups += 1
        covered = [f for f in self._lookups if not f.done]
        targets = {f.partition for f in covered}
        bounds = _bounds(covered)
        for found in covered:
            found.seen_from = self._next.get(found.partition, 0)
            found.records.clear()
        self._cond.release()
        done = False
        try:
            self._scan(targets, covered, left, bounds)
            done = True
        finally:
            self._cond.acquire()
            # A failed catch-up leaves nothing half-assigned.
            self._ended(targets if done else None, failed=not done)
            if done:
                for found in covered:
                    found.done = True

    def _scan(
        self,
        targets: set[Partition],
        covered: list[Lookup],
        left: float,
        bounds: dict[Partition, int],
    ) -> None:
        """Read every target partition from where the index stopped to its end.

        A partition with a bound (``bounds``: every lookup of it named an acknowledged
        offset) ends once the index has read through the bound.  The others end at a fresh
        end: their partitions are assigned afresh at the index's offsets for this catch-up,
        so the end a fetch reports is fresh.  (A consumer that kept them paused between
        catch-ups and sought again was measured to stop fetching a partition now and then on
        the dev broker; the tail is never paused nor sought.)  The partitions stay assigned
        afterwards (the tail).  The records of the keys being looked up are kept for their
        lookups.
        """
        keep: dict[tuple[Partition, bytes], list[Lookup]] = {}
        for found in covered:
            keep.setdefault((found.partition, found.key), []).append(found)
        done = {p for p, bound in bounds.items() if self._next.get(p, 0) > bound}
        if len(done) == len(targets):
            return  # read through every bound already: nothing to fetch
        at_end: set[Partition] = set()
        fresh: set[Partition] = set()
        deadline = time.monotonic() + left
        reader, assigned = self._assigned(targets, fresh_ends=len(bounds) < len(targets))
        ends = at_end if assigned else set()  # an end fetched before this catch-up is stale
        progress = time.monotonic()
        while targets - at_end - done:
            now = time.monotonic()
            if now > deadline:
                raise BrokerError(f"could not reach the end of {self.settings.topic} in time")
            if now - progress > starved_after(reader.fetch_wait_ms) and self._grow(reader):
                progress, ends = now, at_end
            batch = reader.poll(_BATCH, _POLL_S, prompt=True)
            if batch.answered:
                progress = time.monotonic()
            read = self._index(batch, ends, keep)
            fresh |= read
            done |= {p for p in read & bounds.keys() if self._next[p] > bounds[p]}
            if batch.answered and fresh and ends is at_end:
                self._reached(reader, fresh, at_end)

    def _index(
        self,
        batch: Polled,
        ends: set[Partition],
        keep: dict[tuple[Partition, bytes], list[Lookup]],
    ) -> set[Partition]:
        """Index a batch, handing the records of looked-up keys to their lookups; the
        partitions it held records of (ends reported go to ``ends``)."""
        ends.update(batch.at_end)
        read: set[Partition] = set()
        for record in batch.records:
            where = self._take(record)
            if where is None:
                continue
            read.add(where)
            for found in keep.get((where, record.key or b""), ()):
                found.records.append((record.value or b"", record.timestamp))
        return read

    def _reached(
        self, reader: PartitionReader, fresh: set[Partition], at_end: set[Partition]
    ) -> None:
        """Mark done each partition this catch-up read exactly up to its high watermark.

        The watermark is the one librdkafka keeps from the fetch replies (no round trip).
        Read after a record of this catch-up (so after a fetch sent after the assignment),
        it is at least every offset acknowledged before the catch-up began, as the
        partition end is: one broker answers a consumer's fetches one at a time, in order.
        With more than one broker it is not used: librdkafka writes the value from every
        reply before it drops a reply from a partition's former leader, so a leader change
        could leave an older value there, even one equal to where the index is.  Only an
        index ending exactly at it counts: a broker reporting short of its last record
        leaves the partition to its end-of-partition event.
        """
        if not self._one_broker:
            return
        for where in fresh - at_end:
            high = reader.high_watermark(where)
            if high is not None and self._next.get(where) == high:
                at_end.add(where)
                self.watermark_ends += 1

    def _assigned(self, targets: set[Partition], fresh_ends: bool) -> tuple[PartitionReader, bool]:
        """The index's reader with the targets assigned; True when assigned just now.

        The targets and the partitions already tailed are assigned afresh (at the index's
        offsets) when ``fresh_ends`` asks for ends reported after this call, or when a
        target is not tailed yet; otherwise the tail reads on where it is.
        """
        if self._reader is None:
            self._reader = PartitionReader(
                self.settings,
                group=self.settings.group(wire.WORKFLOW_INDEX_ROLE),
                fetch_wait_ms=self.fetch_wait_ms,
                grows=False,
                what="indexing the log",
            )
            topic = self.settings.topic
            self._one_broker = self._reader.brokers(topic, timeout=_WATERMARK_TIMEOUT_S) == 1
        if not fresh_ends and targets <= self._tailing:
            return self._reader, False
        parts = self._tailing | targets
        starts = {(t, p): self._start(t, p) for t, p in sorted(parts)}
        if self._tailing:
            self._reader.unassign()  # drops what was fetched before: ends come fresh
        self._tailing, self._current = set(), set()
        self._reader.assign(starts)
        self.assignments += 1
        self._tailing = parts
        self._reap_when_idle()
        return self._reader, True

    def _ended(self, caught_up: set[Partition] | None, failed: bool) -> None:
        """Close a catch-up (called holding the lock): ``caught_up`` are the partitions it
        read through their ends or bounds (None: it did not finish)."""
        self._running = False
        self._last_used = time.monotonic()
        if self._closing or failed:
            self._closing = False
            self._drop_reader()
        if caught_up is not None:
            self._current |= caught_up & self._tailing
            self._forget_read_notes()
        self._cond.notify_all()

    def _forget_read_notes(self) -> None:
        """Drop the notes of :meth:`wrote` the index has read past."""
        with self._kept_lock:
            for where, written in list(self._written.items()):
                read_to = self._next.get(where, 0)
                kept = {k: o for k, o in written.items() if o >= read_to}
                if kept:
                    self._written[where] = kept
                else:
                    del self._written[where]

    def _reap_when_idle(self) -> None:
        """Start the thread that unassigns the tail after ``TAIL_IDLE_S`` without a lookup."""
        if self._reaper is None:
            self._reaper = threading.Thread(
                target=_reap, args=(weakref.ref(self),), name="stepledger-index-tail", daemon=True
            )
            self._reaper.start()

    def _untail_if_idle(self) -> bool:
        """Unassign the tail if idle or run ahead; False once nothing is assigned (the
        reaper then ends)."""
        with self._cond:
            if self._running or self._lookups:
                return True  # a catch-up may be assigning: never leave it without a reaper
            if self._reader is None or not self._tailing:
                self._reaper = None
                return False
            if time.monotonic() - self._last_used < TAIL_IDLE_S and not self._ran_ahead():
                return True
            self._unassign()
            self._reaper = None
            return False

    def _ran_ahead(self) -> bool:
        """True when a tailed partition is more than ``TAIL_AHEAD_RECORDS`` ahead (called
        holding the lock, with no catch-up running)."""
        for where in self._tailing:
            ahead = self._ahead(where)
            if ahead is not None and ahead[0] - ahead[1] > TAIL_AHEAD_RECORDS:
                return True
        return False

    def _ahead(self, where: Partition) -> tuple[int, int] | None:
        """(the partition's end as the tail's last fetch reported it, no round trip; where
        the index read it to, or began it when it read nothing of it), or None when either
        is not known (librdkafka's end before a fetch: -1001)."""
        reader = self._reader
        read_to = self._next.get(where, self._began.get(where))
        if reader is None or read_to is None:
            return None
        high = reader.high_watermark(where)
        return None if high is None else (high, read_to)

    def _start(self, topic: str, partition: int) -> int:
        """Where a catch-up reads the partition from: where the index stopped, or its log start.

        A partition never read starts at its first record still there, not at offset 0:
        below a deleted head, offset 0 is out of range and librdkafka's reset to the
        earliest offset is slow, every catch-up.  One ListOffsets round per partition and
        process instead; 0 if it fails.
        """
        known = self._next.get((topic, partition))
        if known is not None or self._reader is None:
            return known or 0
        try:
            low, _ = self._reader.watermarks((topic, partition), timeout=_WATERMARK_TIMEOUT_S)
        except BrokerError:
            return 0  # the reset to the earliest offset still finds the start (not recorded)
        self._began[(topic, partition)] = max(0, int(low))
        return max(0, int(low))

    def _grow(self, reader: PartitionReader) -> bool:
        """Read on with a longer fetch wait, every tailed partition assigned afresh where
        it was reached (False: the wait is already the longest)."""
        if not reader.grow():
            return False
        self.fetch_wait_ms = reader.fetch_wait_ms
        self._current = set()  # assigned afresh: a catch-up completes them again
        self.assignments += 1
        return True

    def _unassign(self) -> None:
        if self._reader is not None:
            self._tailing, self._current = set(), set()
            try:
                self._reader.unassign()
            except BrokerError:
                self._drop_reader()

    def _drop_reader(self) -> None:
        self._tailing, self._current = set(), set()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def _take(self, record: Consumed) -> Partition | None:
        """Index one record (its partition), or skip a record indexed already."""
        where = (record.topic, record.partition)
        offset = record.offset
        if offset < self._next.get(where, 0):
            return None  # already indexed
        expected = self._next.get(where, self._began.get(where, offset))
        if offset > expected:
            # Offsets skipped (a head deleted under the catch-up, or control records): what
            # the index holds no longer proves anything about the records it never read.
            self._began.pop(where, None)
        self._next[where] = offset + 1
        self.records += 1
        if where in self._overflowed:
            return where
        keys = self._first.setdefault(where, {})
        key = record.key or b""
        new = key not in keys
        if new:
            keys[key] = offset
            self._keys += 1
            if self._keys > self.max_keys:
                self._overflow(where)
                return where
        self._keep(where, key, new, offset, record)
        return where

    def _keep(self, where: Partition, key: bytes, new: bool, offset: int, record: Consumed) -> None:
        """Keep an unfinished workflow's record; a finished one's records are dropped."""
        with self._kept_lock:
            kept = self._kept.get(where)
            if kept is None:
                kept = self._kept[where] = _Kept(offset)
            values = kept.values.get(key)
            if values is None and not new:
                return  # dropped when it finished, or it began before ``since``
            if _finished(record):
                dropped = kept.values.pop(key, None) or []
                self._kept_bytes -= sum(len(v) for v, _ in dropped)
                return
            value = record.value or b""
            kept.values.setdefault(key, []).append((value, record.timestamp))
            self._kept_bytes += len(value)
            if self._kept_bytes > self.max_kept_bytes:
                # Forget everything kept; every partition keeps again from where it is now.
                self._kept = {p: _Kept(n) for p, n in self._next.items()}
                self._kept_bytes = 0

    def _overflow(self, where: Partition) -> None:
        self._keys -= len(self._first[where])
        self._first[where] = {}
        self._overflowed.add(where)
        with self._kept_lock:
            self._kept.pop(where, None)


def _bounds(covered: list[Lookup]) -> dict[Partition, int]:
    """Each partition whose every lookup names a bound: the highest of them."""
    bounds: dict[Partition, int] = {}
    unbounded = {f.partition for f in covered if f.through is None}
    for found in covered:
        if found.through is not None and found.partition not in unbounded:
            bounds[found.partition] = max(bounds.get(found.partition, -1), found.through)
    return bounds


def _reap(ref: weakref.ReferenceType[PartitionIndex]) -> None:
    """Unassign an index's tail once it has been idle or run ahead (the thread ends with
    the tail; if a check fails, it ends and the next assignment starts another)."""
    while True:
        time.sleep(min(TAIL_IDLE_S / 2, _REAP_EVERY_S))
        index = ref()
        if index is None:
            return
        try:
            if not index._untail_if_idle():
                return
        except BaseException:
            with index._cond:
                index._reaper = None
            raise
        del index


def _finished(record: Consumed) -> bool:
    """True for a workflow's finished event (told by its type header, nothing decoded)."""
    return any(name == "ce_type" and value == _FINISHED for name, value in record.headers)

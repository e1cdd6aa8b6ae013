"""The Kafka :class:`~stepledger.history.protocol.WorkflowHistory`: the checkpoint directory,
the workflow's checkpoint, then its partition's tail.

A workflow's records share one partition, computed with the producers' partitioner
(:mod:`stepledger.kafka.partitioner`).  The checkpoint directory vouches for the records up
to its *progress* (every workflow with a record there has a checkpoint holding it): a
partition it vouches for at least ``SPLIT_RECORDS`` of is read from the progress on, and a
workflow's events are its checkpoint's plus its records after the progress.  The
:class:`~stepledger.history.index.PartitionIndex` is the tail index: it says where the
workflow's records start after the progress (from offset 0 where no checkpointer vouches,
or the partition is small), from what it read since this process's previous read, and
keeps unfinished workflows' records; one fact, split at the progress offset.  Where the
partition's head was deleted and nothing vouches, the guard
(:class:`~stepledger.history.guard.HistoryGuard`) completes the history from the
workflow's checkpoint, or refuses it (invariant 16).  With a partitioner whose choice
cannot be computed (``random``) every partition is read from its start.

Given the projector's database (``snapshot=``: a DuckDB file or a shard directory), the head
of a workflow is the projector's published snapshot instead, and the partition is read
after the snapshot's offset (``Settings.projection``; the snapshot files are read through
:mod:`stepledger.readers.snapshots`, imported when first used, so the SDK needs DuckDB only
then).  Such a history is never known to be whole (the snapshot, not an index, knows which
ids the log holds): every open reads first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from stepledger.checkpoints.points import Covering
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.domain.factory import utc_now
from stepledger.errors import BrokerError, ViewStoreError
from stepledger.history.clock import AppendClock
from stepledger.history.guard import HistoryGuard
from stepledger.history.index import PartitionIndex
from stepledger.history.protocol import History, Until
from stepledger.history.records import (
    FIRST_OFFSET,
    Stamps,
    decoded,
    decoded_stored,
    follow_partition,
    read_to_end,
    where_of,
)
from stepledger.kafka import Position, listed_topics
from stepledger.kafka.partitioner import configured, partition_of
from stepledger.kafka.topics import check_retention
from stepledger.log import codec_for

if TYPE_CHECKING:  # imported when a lake is read: the SDK needs DuckDB only then
    from stepledger.readers.lake import LakeSource

logger = logging.getLogger(__name__)


#: A partition is read from the checkpoint directory's progress on (not from its start)
#: when the directory vouches for at least this many of its records; below, indexing them
#: costs about what a directory lookup does (docs/benchmarks.md).
SPLIT_RECORDS = 20_000
#: Workflows of one split partition looked up in the directory (a handful of point reads
#: each) before its checkpoints are read whole once (then each answer is in memory).
DIRECTORY_WORKFLOWS = 8


@dataclass
class ReadStats:
    """What the last read cost: where its events came from and how long it took."""

    snapshot_events: int = 0
    tail_records: int = 0
    tail_events: int = 0
    seconds: float = 0.0
    snapshot: str | None = None


class KafkaHistory:
    """Reads the workflows of one step log (``settings.topic``) from their partitions."""

    def __init__(
        self,
        settings: Settings,
        codec: Codec | None = None,
        *,
        role: str = "sdk",
        snapshot: str | Path | LakeSource | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self.clock = clock
        """The reader's clock: ``History.appended`` is on it (the SDK passes its own)."""
        self.appends = AppendClock()
        """The reader's lead over the broker, learned from every stamped record it read."""
        self.snapshot: Path | LakeSource | None = (
            snapshot if snapshot is None or isinstance(snapshot, Path) else _projection(snapshot)
        )
        """The projection that is the workflows' head: the projector's database (its
        published snapshot) or the lake the projectors commit to."""
        self.codec = codec or codec_for(settings)
        self.role = role
        """Who reads (named in a retention refusal)."""
        self.last = ReadStats()
        self.index = PartitionIndex(settings)
        """Where each workflow starts in its partition, kept up to date incrementally."""
        self.guard = HistoryGuard(settings, self.codec)
        """Completes what the log still holds with checkpoints, or refuses (expired head)."""
        self._known: list[tuple[str, int]] | None = None
        self._splits: dict[tuple[str, int], int | None] = {}
        """Per partition: the directory's progress the index reads on after (None: the
        index reads it from its log start)."""
        self._caught: set[tuple[str, int]] = set()
        """Split partitions whose checkpoints were read whole once (later answers from them)."""
        self._asked: dict[tuple[str, int], set[str]] = {}
        """The workflows of each split partition asked of the directory (up to a bound)."""
        self._lock = threading.Lock()

    def read(self, workflow_id: str, *, through: Position | None = None) -> History:
        """The workflow's events: its partition from the workflow's first record on.

        The index is caught up first (the records since the last read, keys only; through
        ``through`` when given, no fresh end); where the head was deleted the history is
        completed from the workflow's checkpoint, or HistoryExpiredError.
        """
        check_retention(self.settings, self.role)
        stamps: Stamps = []
        mine = self._workflow_partitions(workflow_id)
        if self.snapshot is not None:
            events = self._snapshot_and_tail(workflow_id, mine, self.snapshot, stamps)
            if events is not None:
                return History(events, appended=self._appended(stamps))
        if len(mine) != 1:
            return History(self._scan(workflow_id, mine, stamps), appended=self._appended(stamps))
        home = mine[0]
        split, covering = self._split(home, workflow_id)
        bound = None if through is None or where_of(through) != home else through.offset
        events, complete, whole, end = self._read_home(workflow_id, home, bound, stamps)
        if split is not None:
            # Read whole after the split: the checkpoints give what lies at or below it.
            after = complete and self.index.began(home) == split + 1
            below = self._below(home, workflow_id, split, covering) if after else None
            if below is not None:
                seen = {e.event_id for e in below}
                events = below + [e for e in events if e.event_id not in seen]
                return History(events, end, True, self._appended(stamps))
            # Not vouched for now (or offsets skipped under the index): from the start.
            starts = {home: FIRST_OFFSET}
            events = read_to_end(self.settings, self.codec, starts, workflow_id, stamps)[0]
            whole = False
        if not whole:
            events = self.guard.complete(workflow_id, home[1], events)
        return History(events, end, whole=True, appended=self._appended(stamps))

    def _appended(self, stamps: Stamps) -> dict[str, datetime]:
        """When the events a read decoded were appended, on the reader's clock (taken now:
        after every record of the read was read)."""
        return self.appends.read(stamps, self.clock())

    def _split(self, home: tuple[str, int], workflow_id: str) -> tuple[int | None, Covering | None]:
        """Where the index reads the partition on after (None: from its start), decided at
        the partition's first read; with the directory's answer for this workflow then."""
        with self._lock:
            if home in self._splits:
                return self._splits[home], None
            split, covering = None, None
            if self.index.read_to(home) is None and self.guard.has_checkpoints:
                topic, number = home
                starts = self.guard.log_start
                low, end = starts.of(topic, number), starts.end(topic, number)
                if end - low >= SPLIT_RECORDS:
                    covering = self.guard.covering(number, workflow_id, fresh=False)
                    progress = None if covering is None else covering.progress
                    vouched = progress is not None and progress + 1 - low >= SPLIT_RECORDS
                    if vouched and progress is not None and self.index.begin(home, progress + 1):
                        split = progress
            self._splits[home] = split
            return split, covering

    def _below(
        self, home: tuple[str, int], workflow_id: str, split: int, covering: Covering | None
    ) -> list[Event] | None:
        """The workflow's events at or below ``split``, from its checkpoint ([]: it has no
        record there), or None when the checkpoint topic does not vouch for them now."""
        if covering is None:
            # The directory's answer (kept per workflow: a read-back costs nothing), until
            # that many workflows were asked: then the partition's checkpoints are read
            # whole once, and later answers come from them.
            with self._lock:
                fresh = False
                if home not in self._caught:
                    asked = self._asked.setdefault(home, set())
                    asked.add(workflow_id)
                    fresh = len(asked) > DIRECTORY_WORKFLOWS
                    if fresh:
                        self._caught.add(home)
                        del self._asked[home]
            covering = self.guard.covering(home[1], workflow_id, fresh=fresh)
        if covering is None or covering.progress is None or covering.progress < split:
            return None
        checkpoint = covering.checkpoint
        if checkpoint is None and covering.doubtful:
            return None  # an undecodable checkpoint may be this workflow's
        return [] if checkpoint is None else decoded(list(checkpoint.events), self.codec)

    def known(self, workflow_id: str) -> History | None:
        """The history the index's tail holds, when it is whole (no round trip): none for an
        id the tail never saw, the kept records of one it did; None when it cannot say.  In
        a partition read from the directory's progress on, only for an id without a
        checkpoint, once the partition's checkpoints were read whole."""
        home = self._listed_home(workflow_id)
        if home is None or self.snapshot is not None:
            return None
        key = workflow_id.encode()
        if (
            self._splits.get(home) is not None
            and self.guard.holds(home[1], workflow_id) is not False
        ):
            return None  # below the split only the checkpoints, read whole, can say
        if self.index.unseen(home, key):
            return History([], None, whole=True)
        values = self.index.tailed(home, key)
        return None if values is None else History(decoded(values, self.codec), None, whole=True)

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after`` in its partition, up to an accepted one."""
        return follow_partition(self.settings, self.codec, workflow_id, after, until, timeout_s)

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Note that this process recorded a claim or an end of the workflow at ``position``."""
        if self._known is not None:
            self.index.wrote(where_of(position), workflow_id.encode(), position.offset)

    def close(self) -> None:
        """Close the index's consumer and the guard's clients."""
        self.index.close()
        self.guard.close()

    def _read_home(
        self, workflow_id: str, home: tuple[str, int], bound: int | None, stamps: Stamps
    ) -> tuple[list[Event], bool, bool, Position | None]:
        """The workflow's events in its partition; whether every record of it the index began
        at; whether whole for certain; where read to."""
        began = time.perf_counter()
        indexed = self.index.records
        found = self.index.lookup(home, workflow_id.encode(), bound)
        end = self.index.read_to(home)
        position = None if end is None else Position(home[0], home[1], end)
        if found.complete:
            # The catch-up saw every record of the workflow (or there are none).
            events = decoded_stored(found.records, self.codec, stamps)
            read = self.index.records - indexed
            self.last = ReadStats(0, read, len(events), time.perf_counter() - began)
            return events, True, found.whole, position
        starts = {home: found.first or FIRST_OFFSET}
        events, scanned = read_to_end(self.settings, self.codec, starts, workflow_id, stamps)
        self.last = ReadStats(0, scanned, len(events), time.perf_counter() - began)
        return events, False, False, position

    def _snapshot_and_tail(
        self,
        workflow_id: str,
        mine: list[tuple[str, int]],
        projection: Path | LakeSource,
        stamps: Stamps,
    ) -> list[Event] | None:
        """The workflow's events from the projector's snapshot, then its partition's tail
        after the snapshot's offset (only the shards of its partitions are opened); None
        with no snapshot yet (the partition is read as without one)."""
        from stepledger.readers.snapshots import (
            is_shard_dir,
            latest_snapshot,
            workflow_events_from_shards,
            workflow_events_from_snapshot,
        )

        began = time.perf_counter()
        source: str | None
        if not isinstance(projection, Path):  # the lake: every partition at one snapshot
            from stepledger.readers.lake import workflow_events_from_lake

            try:
                stored, offsets = workflow_events_from_lake(projection, workflow_id, self.codec)
            except ViewStoreError as exc:  # no table set yet, or the lake out of reach
                logger.info("%s: reading the partition", exc.message)
                return None
            source = str(projection)
        elif is_shard_dir(projection):
            stored, offsets, read = workflow_events_from_shards(
                projection, mine, workflow_id, self.codec
            )
            source = ", ".join(str(p) for p in read) or None
        else:
            path = latest_snapshot(projection)
            if path is None:
                logger.info("no snapshot of %s yet: reading the partition", projection)
                return None
            stored, offsets = workflow_events_from_snapshot(path, workflow_id, self.codec)
            source = str(path)
        stored = [e for e in stored if e.workflow_id == workflow_id]
        starts = {tp: offsets.get(tp, FIRST_OFFSET) for tp in mine}
        tail, scanned = read_to_end(self.settings, self.codec, starts, workflow_id, stamps)
        seen = {e.event_id for e in stored}
        events = stored + [e for e in tail if e.event_id not in seen]
        elapsed = time.perf_counter() - began
        self.last = ReadStats(len(stored), scanned, len(tail), elapsed, source)
        if len(mine) != 1:
            return events
        # The snapshot holds what was projected below its offset: only a log start past
        # that offset lost something the reader needs.
        return self.guard.complete(workflow_id, mine[0][1], events, starts[mine[0]])

    def _scan(
        self, workflow_id: str, partitions: list[tuple[str, int]], stamps: Stamps
    ) -> list[Event]:
        """Every partition from its start (the partitioner cannot be computed)."""
        began = time.perf_counter()
        starts = dict.fromkeys(partitions, FIRST_OFFSET)
        events, scanned = read_to_end(self.settings, self.codec, starts, workflow_id, stamps)
        self.last = ReadStats(0, scanned, len(events), time.perf_counter() - began)
        return events

    def _listed_home(self, workflow_id: str) -> tuple[str, int] | None:
        """The workflow's one partition, when the partitions were listed already (listing
        them would be a round trip) and the partitioner can be computed."""
        if self._known is None:
            return None
        mine = self._workflow_partitions(workflow_id)
        return mine[0] if len(mine) == 1 else None

    def _workflow_partitions(self, workflow_id: str) -> list[tuple[str, int]]:
        """The workflow's partition as the producers' partitioner picks it (all: random)."""
        known = self._partitions()
        partitioner = configured(self.settings.client_config())
        chosen = partition_of(workflow_id.encode(), len(known), partitioner)
        if chosen is None or (self.settings.topic, chosen) not in known:
            return known
        return [(self.settings.topic, chosen)]

    def _partitions(self) -> list[tuple[str, int]]:
        # Asked once per history: a metadata round costs more than reading a short tail.
        if self._known is None:
            topic = self.settings.topic
            listed = listed_topics(self.settings)
            if not listed.get(topic):
                where = self.settings.bootstrap
                raise BrokerError(f"topic {topic!r} does not exist on {where}", retryable=False)
            self._known = [(topic, p) for p in listed[topic]]
            # The same listing tells the guard whether checkpoints exist.
            self.guard.saw_topics(listed)
        return self._known


def _projection(given: str | LakeSource) -> Path | LakeSource:
    """A projector's database named by its path, or the lake as it was given."""
    return Path(given) if isinstance(given, str) else given

"""``stepledger project``: the long-running consumer that keeps the DuckDB projection current.

A consumer group member whose assignment callback seeks every partition to the offset
stored in DuckDB (new partitions start at the beginning); committing offsets to Kafka is
only an optimisation for lag tooling.  Between batches it publishes a read-only snapshot
for analysts.  SIGTERM/SIGINT finish the open batch, commit, close and return.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from stepledger.config import Settings
from stepledger.daemon.health import partitions_unready
from stepledger.daemon.process import Shutdown
from stepledger.deadletters.records import KafkaRecordLetters
from stepledger.errors import BrokerError, ViewStoreError
from stepledger.kafka import ensure_topics, reachable_partitions
from stepledger.kafka.consumer import GroupConsumer, GroupProtocol, Membership, Placement
from stepledger.kafka.gaps import Gap, LogStart
from stepledger.kafka.records import BEGINNING, Consumed
from stepledger.kafka.topics import check_retention
from stepledger.kafka.watch import BrokerWatch, client_logger
from stepledger.log import codec_for
from stepledger.projector.boundary import ViewStore
from stepledger.projector.engine import (
    DEFAULT_CACHE_WORKFLOWS,
    BatchReport,
    Projector,
)
from stepledger.projector.gaps import record_gaps, restore_from_checkpoints
from stepledger.projector.lake import LakeDatabase
from stepledger.projector.lake_shards import LakeShards, fenced
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.position import check_positions
from stepledger.projector.shards import OneFile, ShardDir, Shards, Where
from stepledger.projector.store import DEFAULT_MEMORY_LIMIT, ProjectionStore
from stepledger.readers.lake import LakeConfig, extension_directory
from stepledger.readers.snapshots import is_shard_dir
from stepledger.wire import client_id

logger = logging.getLogger(__name__)

DEFAULT_DB = "stepledger.duckdb"
#: Seconds between snapshots of a changed file, unless the operator says otherwise.
DEFAULT_SNAPSHOT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ProjectorOptions:
    """How the projector daemon runs."""

    db_path: Path = Path(DEFAULT_DB)
    """The DuckDB file it owns (one process), or a shard directory (one file per partition,
    shared by every projector of the group; a path not ending in ``.duckdb``)."""
    topics: tuple[str, ...] = ()
    """Topics to project; empty means the settings' step-log topic."""
    group: str = ""
    """Consumer group id; give each projection file its own (empty: the settings'
    ``projector_group``, or ``lake_projector_group`` with a lake, named after the step log)."""
    batch_size: int = 10_000
    """Most records per batch (one DuckDB transaction)."""
    batch_timeout_s: float = 0.03
    """How long a poll waits for records; what it returns is committed as soon as the
    writer is free (records that come while it commits go in its next batch)."""
    snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S
    """Publish a snapshot of a changed file at most this often (0 disables); readers are at
    most ~this stale once the projector has caught up.  The interval stretches so that a
    file's snapshots take at most ``SNAPSHOT_SHARE`` of the time (a copy of a large file),
    and ``CATCH_UP_SNAPSHOT_SHARE`` while the partitions it read since its last snapshot
    hold at least another ``batch_size`` records beyond what was read
    (``CATCH_UP_SNAPSHOT_GAP_MAX_S`` apart at most)."""
    cache_workflows: int = DEFAULT_CACHE_WORKFLOWS
    """Workflow fold states kept in memory; others are rebuilt from stored events."""
    commit_to_kafka: bool = True
    """Also commit offsets to the group (for lag tools); DuckDB's offsets stay the truth."""
    lag_interval_s: float = 1.0
    """How often the consumer-lag gauge is refreshed."""
    session_timeout_s: float = 6.0
    """Consumer-group session timeout: how long a restart waits for a killed member to expire."""
    memory_limit: str = DEFAULT_MEMORY_LIMIT
    """DuckDB's memory limit for the projection (DuckDB's own default is 80% of the machine)."""
    instance_id: str | None = None
    """Static group membership: a restart within the session timeout moves no partition."""
    group_protocol: GroupProtocol | None = None
    """``classic`` (cooperative-sticky) or ``consumer`` (KIP-848); None: ``-X`` or classic."""
    lake: LakeConfig | None = None
    """Project into this DuckLake instead of ``db_path`` (each partition's tables, shared by
    every projector of the group, on any machine)."""

    def for_settings(self, settings: Settings) -> ProjectorOptions:
        """These options with the group named (the settings' when none was given: a lake's
        projectors have a group of their own, so they never split partitions with a file's)."""
        if self.group:
            return self
        group = settings.lake_projector_group if self.lake else settings.projector_group
        return replace(self, group=group)

    def membership(self) -> Membership:
        """How the projector takes part in its consumer group."""
        return Membership(
            group=self.group,
            session_timeout_s=self.session_timeout_s,
            protocol=self.group_protocol,
            instance_id=self.instance_id,
            client_id=client_id("projector"),
        )


BatchHook = Callable[[BatchReport], None]
#: How soon a partition held back (its shard locked by a previous owner) is tried again; each
#: try that finds a shard still locked doubles the wait, up to ``HELD_RETRY_S``.
HELD_FIRST_RETRY_S = 0.05
#: How often a partition held back for a while is tried again.
HELD_RETRY_S = 1.0
#: The share of the time a file's snapshots may take once caught up: the next one waits at
#: least four times as long as the last one took (a checkpoint and a copy of the whole
#: file, which grows with it), so a large file's snapshots never crowd out its commits.
SNAPSHOT_SHARE = 0.25
#: While a file catches up, the share of the time its snapshots may take: the next one waits
#: at least ten times as long as the last one took.  Behind means at least another
#: ``batch_size`` records wait beyond what was read (the client's cached ends, no clock): a
#: snapshot is stale by that backlog anyway.
CATCH_UP_SNAPSHOT_SHARE = 0.1
#: The longest a catch-up stretches the interval: analysts see a new snapshot at least this
#: often (plus the snapshot's own time), and the 60 s staleness alert of docs/operators.md
#: stays quiet unless one snapshot takes longer than this.
CATCH_UP_SNAPSHOT_GAP_MAX_S = 30.0


@dataclass
class _Loop:
    consumer: GroupConsumer
    options: ProjectorOptions
    metrics: ProjectorMetrics
    on_batch: BatchHook | None
    settings: Settings | None = None
    shards: Shards | None = None
    dirty: set[Where] = field(default_factory=set)
    read: dict[Where, int] = field(default_factory=dict)
    """The next offset to read of each partition, from the records polled so far."""
    last_lag: float = -math.inf
    assigned: list[Where] = field(default_factory=list)
    watch: BrokerWatch | None = None
    """One line when the broker is lost and one when it is back."""
    log_start: LogStart | None = None
    """Each partition's log start, compared with the stored offsets on assignment."""
    unplaced: dict[Where, int] = field(default_factory=dict)
    """Held partitions whose shard is taken, still paused until their seek is accepted."""
    last_held_try: float = -math.inf
    held_retry_s: float = HELD_FIRST_RETRY_S
    joined: bool = False
    """An assignment (even an empty one) arrived: the member is in its group."""

    @property
    def state(self) -> Shards:
        assert self.shards is not None, "the loop's shards are set before it runs"
        return self.shards


def run_projector(
    settings: Settings,
    options: ProjectorOptions,
    *,
    shutdown: Shutdown,
    metrics: ProjectorMetrics | None = None,
    on_batch: BatchHook | None = None,
) -> None:
    """Project the topics into the DuckDB file (or shard directory) until a shutdown."""
    options = options.for_settings(settings)
    membership = options.membership()  # a bad group setting fails before any network
    if options.lake is not None:
        extension_directory()  # so does a lake without the [lake] extra
    topics = list(options.topics or (settings.topic,))
    for topic in topics:
        reachable_partitions(settings, topic)
    ensure_topics(settings, [settings.dlq_topic])
    check_retention(settings, "projector")
    metrics = metrics or ProjectorMetrics()
    dead_letters = KafkaRecordLetters(settings)
    watch = BrokerWatch(logger, on_change=lambda up: metrics.broker_up.set(1 if up else 0))
    metrics.broker_up.set(1)
    consumer = GroupConsumer(
        settings,
        membership,
        error_cb=watch.on_error,
        logger=client_logger("stepledger.projector.kafka"),
    )
    loop = _Loop(consumer, options, metrics, on_batch, settings)
    loop.watch = watch
    try:
        with fewer_collections():

            def make(store: ViewStore) -> Pipeline:
                projector = Projector(
                    store,
                    codec_for(settings),
                    dead_letters,
                    group=options.group,
                    cache_workflows=options.cache_workflows,
                )
                pipeline = Pipeline(
                    projector,
                    on_commit=lambda report: _committed(loop, report),
                    batch_size=options.batch_size,
                )
                pipeline.on_snapshot = lambda _, took: metrics.published(took)
                return pipeline

            loop.shards = _open_state(options, make, settings.topic)
            _serve(loop, topics, shutdown)
    finally:
        try:
            if loop.shards is not None:
                loop.shards.shutdown()
        finally:
            dead_letters.close()


#: Net allocations of tracked objects between two young collections while the daemon runs.
YOUNG_COLLECTION_EVERY = 1_000_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect cycles rarely while projecting, and never through what startup allocated.

    Each batch allocates several objects per event and the fold cache keeps many alive, so
    the default thresholds ran full collections over the cache several times a batch.  A
    poll's records and events are freed by reference counting once its batch is prepared,
    so past a million net allocations a young collection finds mostly the fold cache's
    survivors (docs/benchmarks.md, appendix).
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _open_state(
    options: ProjectorOptions, make: Callable[[ViewStore], Pipeline], log: str
) -> Shards:
    if options.lake is not None:
        return LakeShards(LakeDatabase(options.lake, log), make)
    path = options.db_path
    if is_shard_dir(path):
        return ShardDir(
            path,
            make,
            opener=lambda shard: ProjectionStore(shard, memory_limit=options.memory_limit),
        )
    store = ProjectionStore(path, memory_limit=options.memory_limit)
    return OneFile(path, make(store))


def _serve(loop: _Loop, topics: list[str], shutdown: Shutdown) -> None:
    state = loop.state
    for pipeline in state.pipelines():
        pipeline.publish()
        pipeline.drain()
    loop.consumer.subscribe(
        topics,
        on_assign=lambda ps: _on_assign(loop, ps),
        on_revoke=lambda ps: _on_revoke(loop, ps),
        on_lost=lambda ps: _on_lost(loop, ps),
    )
    into = loop.options.db_path if loop.options.lake is None else "the lake"
    logger.info("projecting %s into %s as group %s", topics, into, loop.options.group)
    try:
        while not shutdown.requested:
            _step(loop)
        # Every partition is given up as on a revocation: committed, snapshotted, closed.
        _publish_all(loop)
        for pipeline in state.pipelines():
            pipeline.drain()
        state.close(list(loop.assigned))
    finally:
        loop.consumer.close()
    logger.info("projector stopped cleanly")


def _on_assign(loop: _Loop, keys: list[Where]) -> Placement:
    """Open the partitions' state: where each is read from, and those held back (paused)."""
    state = loop.state
    stored = state.open(keys)
    held = state.held() & set(keys)
    _checked(loop, [k for k in keys if k not in held], stored)
    starts = {where: stored.get(where, BEGINNING) for where in keys}
    # Eager: a revocation of everything came first; cooperative: only these partitions move.
    kept = [where for where in loop.assigned if where not in set(keys)]
    loop.assigned = kept + list(keys)
    loop.joined = True
    for where in keys:
        loop.unplaced.pop(where, None)
        loop.read.pop(where, None)  # reading starts again where the store says
    if held:
        # Tried again from the loop, soon at first: a previous owner's close is quick.
        loop.last_held_try, loop.held_retry_s = time.monotonic(), HELD_FIRST_RETRY_S
    _count_held(loop)
    logger.info(
        "assigned %s",
        ", ".join(
            f"{t}[{p}]" + (" (held back)" if (t, p) in held else f"@{starts[(t, p)]}")
            for t, p in keys
        ),
        extra={"partitions": len(keys), "held": len(held)},
    )
    return Placement(starts, held)


def _checked(loop: _Loop, keys: list[Where], stored: dict[Where, int]) -> None:
    """Compare newly opened partitions' stored offsets with the log (gaps, positions)."""
    if loop.settings is None or not keys:
        return
    gapped = _record_gaps(loop, keys, stored)
    # A partition past a gap starts at the log start: nothing below it to read back.
    probed = {where: n for where, n in stored.items() if where in keys and where not in gapped}
    state = loop.state
    check_positions(
        loop.settings, probed, lambda *at: _last_event(state, *at), db=str(loop.options.db_path)
    )


def _take_held(loop: _Loop) -> None:
    """Take the held shards their previous owner let go; start reading them where they were."""
    taken = loop.state.take_held()
    if taken:
        stored = {where: n for where, n in taken.items() if n is not None}
        _checked(loop, sorted(taken), stored)
        for where in taken:
            loop.unplaced[where] = stored.get(where, BEGINNING)
    for (topic, partition), offset in list(loop.unplaced.items()):
        if loop.consumer.release((topic, partition), offset):
            del loop.unplaced[(topic, partition)]
            loop.read.pop((topic, partition), None)
            logger.info("%s[%d] released: projecting from offset %d", topic, partition, offset)
    _count_held(loop)


def _count_held(loop: _Loop) -> None:
    """Partitions assigned but not projected: shards still locked, or not yet sought."""
    loop.metrics.partitions_held.set(len(loop.state.held()) + len(loop.unplaced))


def _record_gaps(loop: _Loop, keys: list[Where], stored: dict[Where, int]) -> set[Where]:
    """Gaps below the log start: reported, counted, kept in ``gaps``; ``stored`` moves on."""
    assert loop.settings is not None
    if loop.log_start is None:
        loop.log_start = LogStart(loop.settings)

    def store_of(where: Where) -> ViewStore | None:
        pipeline = loop.state.pipeline(where)
        return None if pipeline is None else pipeline.projector.store

    gapped: set[Where] = set()
    settings, ends = loop.settings, loop.log_start

    def restore(gap: Gap) -> bool:
        pipeline = loop.state.pipeline((gap.topic, gap.partition))
        return pipeline is not None and restore_from_checkpoints(settings, pipeline, gap, ends)

    try:
        found = record_gaps(loop.log_start, keys, stored, store_of, loop.options.group, restore)
    except BrokerError as exc:
        # Not knowing the log start stops nothing: the position check below still runs.
        logger.warning("could not compare the stored offsets with the log start: %s", exc)
        return gapped
    gaps, restored = found
    for gap in gaps:
        if gap not in restored:
            loop.metrics.records_lost.labels(gap.topic, str(gap.partition)).inc(gap.records_lost)
        # Restored or not, the partition starts at its log start now.
        pipeline = loop.state.pipeline((gap.topic, gap.partition))
        if pipeline is not None:
            pipeline.projector.reload_offsets()
        if gap in restored:
            # Published with the next snapshot even if no record follows (an idle log).
            loop.dirty.add((gap.topic, gap.partition))
        gapped.add((gap.topic, gap.partition))
    return gapped


def _last_event(state: Shards, topic: str, partition: int, below: int) -> tuple[int, bytes] | None:
    pipeline = state.pipeline((topic, partition))
    if pipeline is None:
        return None
    return pipeline.projector.store.last_event(topic, partition, below)


def _on_revoke(loop: _Loop, partitions: list[Where]) -> None:
    # Commit what was read from them while they are still ours, then let them go: a shard
    # is snapshotted and closed so the next owner can take its lock.
    gone = _give_up(loop, partitions, commit=loop.options.commit_to_kafka)
    logger.info("revoked %s", ", ".join(f"{t}[{p}]" for t, p in gone))


def _on_lost(loop: _Loop, partitions: list[Where]) -> None:
    """Partitions the group gave away while this member was gone past its session (paused,
    starved): their shards are closed at once, so their new owners, holding them back,
    take the locks; what was in flight still lands in them first, under this member's lock
    and with their offsets, and the new owners read on from there.  No offset goes to the
    group: the partitions are not this member's to commit."""
    gone = _give_up(loop, partitions, commit=False)
    logger.warning(
        "lost %s: the group gave them away while this projector was gone past its session; "
        "their shards are closed for their new owners",
        ", ".join(f"{t}[{p}]" for t, p in gone),
        extra={"partitions": len(gone)},
    )


def _give_up(loop: _Loop, partitions: list[Where], *, commit: bool) -> list[Where]:
    gone = list(partitions)
    leaving = {id(p) for w in gone if (p := loop.state.pipeline(w)) is not None}
    try:
        for pipeline in loop.state.pipelines():
            try:
                pipeline.drain()
            except ViewStoreError:
                # A lake partition another projector took over while this one was paused:
                # its late batch was refused (nothing committed); it is given up here.
                if id(pipeline) not in leaving or fenced(pipeline) is None:
                    raise
        if commit:
            _commit_to_kafka(loop)
    finally:
        try:
            # Released even when committing failed: a shard left open would keep its lock.
            loop.state.close(gone)
        finally:
            _forget(loop, gone)
    return gone


def _forget(loop: _Loop, gone: list[Where]) -> None:
    loop.assigned = [where for where in loop.assigned if where not in set(gone)]
    # A partition given up from a file that stays open (one file for all) keeps its changes
    # there: they are published with that file's next snapshot.
    loop.dirty = {w for w in loop.dirty if w not in gone or loop.state.pipeline(w) is not None}
    for where in gone:
        loop.unplaced.pop(where, None)
        loop.read.pop(where, None)
    _count_held(loop)
    for topic, partition in gone:
        try:
            loop.metrics.lag.remove(topic, str(partition))
        except KeyError:
            continue


def _step(loop: _Loop) -> None:
    loop.metrics.health.beat()
    polled = loop.consumer.poll(loop.options.batch_size, loop.options.batch_timeout_s)
    _watch_broker(loop, polled.answered)
    records = polled.records
    for pipeline, batch, wheres in _by_pipeline(loop.state, records, loop.read):
        pipeline.feed(batch)
        loop.dirty.update(wheres)
    for pipeline in loop.state.pipelines():
        # What was fed while its writer was busy goes as one batch once the writer is free.
        pipeline.pump()
    for where in polled.at_end:
        # Nothing waits past here, whatever the cached end says (a transaction's marker).
        loop.read.pop(where, None)
    now = time.monotonic()
    published = loop.options.snapshot_interval_s > 0 and loop.dirty and _publish_due(loop, now)
    if not records and not published:
        # Idle: commit what is in flight now rather than when the next batch arrives.
        for pipeline in loop.state.pipelines():
            pipeline.drain()
    if now - loop.last_lag >= loop.options.lag_interval_s:
        _refresh_lag(loop)
        loop.last_lag = now
    if (loop.unplaced or loop.state.held()) and now - loop.last_held_try >= loop.held_retry_s:
        loop.last_held_try = now
        loop.held_retry_s = min(HELD_RETRY_S, loop.held_retry_s * 2)
        _take_held(loop)


def _publish_due(loop: _Loop, now: float) -> bool:
    """Queue a snapshot of each changed file whose next one is due (later while it is behind);
    whether any was queued."""
    changed: dict[int, tuple[Pipeline, list[Where]]] = {}
    for where in list(loop.dirty):
        pipeline = loop.state.pipeline(where)
        if pipeline is None:
            loop.dirty.discard(where)
        else:
            changed.setdefault(id(pipeline), (pipeline, []))[1].append(where)
    interval = loop.options.snapshot_interval_s
    queued = False
    for pipeline, wheres in changed.values():
        waited = now - pipeline.published_at
        if waited < interval:
            continue
        behind = _backlog(loop, wheres) >= loop.options.batch_size
        if waited >= snapshot_gap(interval, pipeline.snapshot_s, behind=behind):
            pipeline.publish()
            loop.dirty.difference_update(wheres)
            queued = True
    return queued


def _backlog(loop: _Loop, wheres: list[Where]) -> int:
    """Records that wait in these partitions beyond what was read (the client's cached ends)."""
    waiting = 0
    for topic, partition in wheres:
        high = loop.consumer.high_watermark((topic, partition))
        read = loop.read.get((topic, partition))
        if high is not None and read is not None:
            waiting += max(0, high - read)
    return waiting


def snapshot_gap(interval: float, took: float, *, behind: bool) -> float:
    """Seconds from one snapshot to the next: the configured ``interval``, stretched so that
    the last snapshot's cost (``took`` seconds) is at most its share (less while ``behind``)."""
    if interval <= 0:
        return interval
    share = CATCH_UP_SNAPSHOT_SHARE if behind else SNAPSHOT_SHARE
    return max(interval, min(took / share, CATCH_UP_SNAPSHOT_GAP_MAX_S))


def _by_pipeline(
    state: Shards, records: list[Consumed], read: dict[Where, int]
) -> list[tuple[Pipeline, list[Consumed], set[Where]]]:
    """Each open pipeline's records, in the order read, and the partitions they come from;
    ``read`` takes the next offset of each partition.

    One batch, so one transaction, per pipeline: with one file that is the whole poll (a
    batch per partition paid every table's insert and the commit once per partition).
    Records of a partition not open here (fetched just before a revocation) are left to
    its next owner.
    """
    grouped: dict[int, tuple[Pipeline, list[Consumed], set[Where]]] = {}
    pipelines: dict[Where, Pipeline | None] = {}
    for record in records:
        where = (record.topic, record.partition)
        if where not in pipelines:
            pipelines[where] = state.pipeline(where)
        pipeline = pipelines[where]
        if pipeline is None:
            continue
        read[where] = record.offset + 1
        batch = grouped.get(id(pipeline))
        if batch is None:
            batch = grouped[id(pipeline)] = (pipeline, [], set())
        batch[1].append(record)
        batch[2].add(where)
    return list(grouped.values())


def _committed(loop: _Loop, report: BatchReport) -> None:
    if report.skipped:
        # The consumer went back below what is projected: on Kafka, the log was reset under
        # a running projector (an assignment checks it; see projector.position).
        logger.error(
            "%d records below the stored offsets were not projected again; if the topic was "
            "re-created, stop and run `stepledger rebuild --db %s --force`",
            report.skipped,
            loop.options.db_path,
        )
    loop.metrics.record(report, report.seconds)
    if loop.options.commit_to_kafka:
        _commit_to_kafka(loop)
    if loop.on_batch is not None:
        loop.on_batch(report)


def _watch_broker(loop: _Loop, answered: bool) -> None:
    watch = loop.watch
    if watch is None:
        return
    if answered:
        watch.reachable()
    elif watch.should_probe() and loop.consumer.reachable():
        # An idle topic sends nothing back: its metadata tells that the broker is up.
        watch.reachable()


def _committed_offsets(loop: _Loop) -> dict[Where, int]:
    committed: dict[Where, int] = {}
    for pipeline in loop.state.pipelines():
        committed.update(pipeline.projector.committed)
    return committed


def _commit_to_kafka(loop: _Loop) -> None:
    committed = _committed_offsets(loop)
    offsets = {where: committed[where] for where in loop.assigned if where in committed}
    if offsets:
        # Only an optimisation: the offsets that count are in DuckDB.
        loop.consumer.commit(offsets)


def _publish_all(loop: _Loop) -> None:
    """Queue a snapshot of every open file (at a stop)."""
    for pipeline in loop.state.pipelines():
        pipeline.publish()
    loop.dirty.clear()


def _refresh_lag(loop: _Loop) -> None:
    committed = _committed_offsets(loop)
    behind: dict[str, int | None] = {}
    for where in loop.assigned:
        high = loop.consumer.high_watermark(where)
        name = f"{where[0]}[{where[1]}]"
        behind[name] = None
        if high is None:
            continue
        lag = max(0, high - committed.get(where, 0))
        behind[name] = lag
        loop.metrics.lag.labels(topic=where[0], partition=str(where[1])).set(lag)
    # Ready (/readyz) once in the group, every partition placed and read near its end.
    held = len(loop.state.held()) + len(loop.unplaced)
    up = loop.watch is None or loop.watch.up
    unready = partitions_unready(
        "the projector", joined=loop.joined, behind=behind, held=held, broker_up=up
    )
    loop.metrics.health.report(unready)

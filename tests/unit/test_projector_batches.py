"""How the daemon turns a poll into batches (one transaction per pipeline) and collects cycles."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import cast

from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.kafka.consumer import GroupConsumer
from stepledger.kafka.records import Consumed, Polled, Where
from stepledger.projector.daemon import (
    CATCH_UP_SNAPSHOT_GAP_MAX_S,
    CATCH_UP_SNAPSHOT_SHARE,
    SNAPSHOT_SHARE,
    YOUNG_COLLECTION_EVERY,
    ProjectorOptions,
    _committed,
    _forget,
    _Loop,
    _on_assign,
    _step,
    fewer_collections,
    snapshot_gap,
)
from stepledger.projector.engine import BatchReport, Projector
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.shards import OneFile, ShardDir, Shards
from stepledger.projector.snapshot import latest_snapshot
from stepledger.projector.store import ProjectionStore
from tests.unit.projector_harness import CODEC, table_contents, to_messages
from tests.unit.projector_logs import random_log


class _Polls:
    """A consumer that hands out one poll of given records, then nothing."""

    def __init__(self, records: list[Consumed]) -> None:
        self.records = records
        self.ends: dict[Where, int] = {}
        self.high: dict[tuple[str, int], int] = {}

    def poll(self, size: int, timeout: float) -> Polled:
        records, self.records = self.records, []
        ends, self.ends = self.ends, {}
        return Polled(records, ends)

    def high_watermark(self, where: Where) -> int | None:
        return self.high.get(where)


def run_one_poll(shards: Shards, records: list[Consumed], path: Path) -> list[BatchReport]:
    """One turn of the daemon's loop over a poll of these records; the batches committed."""
    reports: list[BatchReport] = []
    options = ProjectorOptions(db_path=path, snapshot_interval_s=0, commit_to_kafka=False)
    consumer = cast(GroupConsumer, _Polls(records))
    loop = _Loop(consumer, options, ProjectorMetrics(), reports.append, shards=shards)
    for pipeline in shards.pipelines():
        pipeline.on_commit = lambda report: _committed(loop, report)
    _step(loop)
    for pipeline in shards.pipelines():
        pipeline.drain()
    return reports


def make_pipeline(store: ProjectionStore) -> Pipeline:
    return Pipeline(Projector(store, CODEC, MemoryRecordLetters()))


def test_one_file_commits_a_poll_of_several_partitions_in_one_transaction(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=5, workflows=20), partitions=3)
    assert {m.partition for m in messages} == {0, 1, 2}
    path = tmp_path / "p.duckdb"
    shards = OneFile(path, make_pipeline(ProjectionStore(path)))
    reports = run_one_poll(shards, messages, path)
    assert [r.received for r in reports] == [len(messages)]
    offsets = shards.pipeline(("log", 0)).projector.committed  # type: ignore[union-attr]
    assert offsets == {("log", p): len([m for m in messages if m.partition == p]) for p in range(3)}
    shards.shutdown()
    # The same rows as batches of one partition each.
    single = tmp_path / "single.duckdb"
    with ProjectionStore(single) as store:
        projector = Projector(store, CODEC, MemoryRecordLetters())
        for p in range(3):
            projector.process([m for m in messages if m.partition == p])
    assert table_contents(path) == table_contents(single)


def test_a_shard_directory_commits_each_partition_of_a_poll_in_its_own_shard(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=6, workflows=12), partitions=2)
    shards = ShardDir(tmp_path / "s", make_pipeline)
    shards.open([("log", 0), ("log", 1)])
    reports = run_one_poll(shards, messages, tmp_path / "s")
    assert sorted(r.received for r in reports) == sorted(
        len([m for m in messages if m.partition == p]) for p in range(2)
    )
    shards.shutdown()


def test_the_daemon_collects_young_objects_once_per_million_allocations() -> None:
    # A poll allocates ~100,000 tracked objects that reference counting frees: a young
    # collection every 100,000 ran ~80 times per million events, ~70 ms each.
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_EVERY >= 1_000_000
    assert gc.get_threshold() == before


def test_snapshots_take_at_most_their_share_of_the_time_a_smaller_one_while_catching_up() -> None:
    # Caught up: the configured interval, stretched so that a snapshot (a copy of the whole
    # file) takes at most a quarter of the time.
    assert SNAPSHOT_SHARE == 0.25
    assert snapshot_gap(0.5, 0.05, behind=False) == 0.5
    assert snapshot_gap(0.5, 0.5, behind=False) == 2.0
    assert snapshot_gap(2.0, 20.0, behind=False) == CATCH_UP_SNAPSHOT_GAP_MAX_S
    # Behind (a batch or more waits): the next snapshot waits until the last one's cost is a
    # tenth of the time since.
    assert CATCH_UP_SNAPSHOT_SHARE == 0.1
    assert snapshot_gap(2.0, 1.5, behind=True) == 15.0
    assert snapshot_gap(2.0, 0.05, behind=True) == 2.0
    # Never longer than the cap, whatever a snapshot costs (a huge file).
    assert snapshot_gap(2.0, 20.0, behind=True) == CATCH_UP_SNAPSHOT_GAP_MAX_S == 30.0
    assert snapshot_gap(45.0, 20.0, behind=True) == 45.0  # the configured interval wins
    # Disabled stays disabled.
    assert snapshot_gap(0.0, 1.5, behind=True) == 0.0


#: What the last snapshot took, in the loops below.
COSTLY_S = 0.2


def costly_loop(tmp_path: Path, batch_size: int) -> tuple[_Loop, _Polls, Pipeline]:
    """A loop over one file whose last snapshot took 0.2 s, queued 1 s ago (interval 0.5 s):
    due when caught up (0.8 s, four times its cost), not while behind (2 s, ten times)."""
    path = tmp_path / "p.duckdb"
    pipeline = make_pipeline(ProjectionStore(path))
    options = ProjectorOptions(
        db_path=path, snapshot_interval_s=0.5, batch_size=batch_size, commit_to_kafka=False
    )
    polls = _Polls([])
    shards = OneFile(path, pipeline)
    loop = _Loop(cast(GroupConsumer, polls), options, ProjectorMetrics(), None, shards=shards)
    pipeline.snapshot_s = COSTLY_S
    pipeline.published_at = time.monotonic() - 1.0
    return loop, polls, pipeline


def test_a_backlog_holds_a_costly_snapshot_back_and_full_polls_without_one_do_not(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=8, workflows=12), partitions=1)
    path = tmp_path / "p.duckdb"
    # Every poll comes back full (batch_size 5): a small batch size, or a steady rate that
    # fills it, is not a backlog.  The last snapshot took 0.2 s and was queued 1 s ago: due
    # caught up, but not while 5 or more records wait beyond what was read (2 s).
    loop, polls, pipeline = costly_loop(tmp_path, batch_size=5)
    published: list[tuple[str, float]] = []
    pipeline.on_snapshot = lambda at, took: published.append((at, took))
    polls.records = messages[:5]
    polls.high[("log", 0)] = 10
    _step(loop)
    pipeline.drain()
    assert loop.read == {("log", 0): 5}
    assert loop.dirty, "a snapshot was published while 5 records waited"
    assert latest_snapshot(path) is None
    polls.records = messages[5:10]
    polls.high[("log", 0)] = 10  # full again, and nothing waits beyond it
    _step(loop)
    pipeline.drain()
    assert not loop.dirty
    assert latest_snapshot(path) is not None
    assert 0 < pipeline.snapshot_s != COSTLY_S, "the snapshot's own duration was not measured"
    assert published == [(str(latest_snapshot(path)), pipeline.snapshot_s)]
    # A cached end below what was read (a broker that lost its tail) leaves nothing waiting.
    polls.records = messages[10:15]
    polls.high[("log", 0)] = 2
    pipeline.snapshot_s, pipeline.published_at = COSTLY_S, time.monotonic() - 1.0
    _step(loop)
    pipeline.drain()
    assert not loop.dirty and len(published) == 2
    loop.state.shutdown()


def test_one_shard_behind_does_not_hold_back_another_shards_snapshot(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=9, workflows=12), partitions=2)
    shards = ShardDir(tmp_path / "s", make_pipeline)
    shards.open([("log", 0), ("log", 1)])
    options = ProjectorOptions(
        db_path=tmp_path / "s", snapshot_interval_s=0.5, batch_size=3, commit_to_kafka=False
    )
    first = [next(m for m in messages if m.partition == p) for p in (0, 1)]
    polls = _Polls(first)
    loop = _Loop(cast(GroupConsumer, polls), options, ProjectorMetrics(), None, shards=shards)
    behind, current = shards.pipeline(("log", 0)), shards.pipeline(("log", 1))
    assert behind is not None and current is not None
    for pipeline in (behind, current):
        pipeline.snapshot_s = COSTLY_S
        pipeline.published_at = time.monotonic() - 1.0
    polls.high = {("log", 0): first[0].offset + 1 + 3, ("log", 1): first[1].offset + 1}
    _step(loop)
    for pipeline in (behind, current):
        pipeline.drain()
    assert loop.dirty == {("log", 0)}
    assert current.published_at > behind.published_at
    shards.shutdown()


def test_a_partition_at_its_end_has_nothing_waiting_whatever_its_cached_end_says(
    tmp_path: Path,
) -> None:
    # A transaction's marker (or an aborted one) past the last record leaves the cached end
    # ahead of every offset read: the end-of-partition report says nothing waits.
    messages = to_messages(random_log(seed=10, workflows=6), partitions=1)
    loop, polls, pipeline = costly_loop(tmp_path, batch_size=1)
    polls.records = messages[:3]
    polls.high[("log", 0)] = 3 + 5
    _step(loop)
    pipeline.drain()
    assert loop.dirty == {("log", 0)}
    polls.ends = {("log", 0): 0}
    _step(loop)
    pipeline.drain()
    assert not loop.dirty and ("log", 0) not in loop.read
    assert latest_snapshot(tmp_path / "p.duckdb") is not None
    loop.state.shutdown()


def test_offsets_read_before_an_assignment_or_a_revocation_are_forgotten(tmp_path: Path) -> None:
    loop, _polls, _pipeline = costly_loop(tmp_path, batch_size=1)
    loop.read = {("log", 0): 7, ("log", 1): 9}
    _on_assign(loop, [("log", 0)])
    assert loop.read == {("log", 1): 9}
    # One file keeps a revoked partition's rows: they still go out with its next snapshot.
    loop.dirty = {("log", 1)}
    _forget(loop, [("log", 1)])
    assert loop.read == {} and loop.dirty == {("log", 1)}
    loop.state.shutdown()


def test_a_published_snapshot_is_counted_with_what_it_took() -> None:
    metrics = ProjectorMetrics()
    metrics.published(1.5)
    value = metrics.registry.get_sample_value
    assert value("stepledger_projector_snapshot_seconds_count") == 1
    assert value("stepledger_projector_snapshot_seconds_sum") == 1.5
    assert (value("stepledger_projector_snapshot_timestamp_seconds") or 0) > time.time() - 60

"""The fold cache's eviction rules and the writer pipeline's ordering (real DuckDB files)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ViewStoreError
from stepledger.projector.engine import Projector
from stepledger.projector.fold import WorkflowCache
from stepledger.projector.pipeline import DEFAULT_DEPTH, Pipeline
from stepledger.projector.projection import WorkflowProjection
from stepledger.projector.snapshot import latest_snapshot
from stepledger.projector.store import ProjectionStore
from tests.unit.projector_harness import CODEC, batches, table_contents, to_messages
from tests.unit.projector_logs import random_log


def query_one(path: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def cache_of(*ids: str, capacity: int) -> WorkflowCache:
    cache = WorkflowCache(capacity)
    for workflow_id in ids:
        cache.put(WorkflowProjection(workflow_id))
    return cache


def test_the_cache_evicts_least_recently_used_but_never_a_workflow_in_flight() -> None:
    cache = cache_of("a", "b", "c", "d", capacity=2)
    cache.get("a")  # now the most recent
    cache.trim(keep=frozenset({"b"}))
    assert "a" in cache and "b" in cache and len(cache) == 2
    assert cache.missing(["a", "c", "c", "e"]) == ["c", "e"]
    cache.trim()
    assert len(cache) == 2


def test_pipelined_batches_build_the_same_tables_and_snapshots_hold_what_came_before(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=12, workflows=30))
    direct, piped = tmp_path / "direct.duckdb", tmp_path / "piped.duckdb"
    with ProjectionStore(direct) as store:
        projector = Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=4)
        for batch in batches(messages, random.Random(3), 40):
            projector.process(batch)
    committed: list[int] = []
    with ProjectionStore(piped) as store:
        pipeline = Pipeline(
            Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=4),
            on_commit=lambda report: committed.append(report.received),
        )
        parts = list(batches(messages, random.Random(3), 40))
        for part in parts[: len(parts) // 2]:
            pipeline.feed(part)
        pipeline.publish()
        half = sum(len(p) for p in parts[: len(parts) // 2])
        for part in parts[len(parts) // 2 :]:
            pipeline.feed(part)
        pipeline.close()
    assert sum(committed) == len(messages)
    assert table_contents(piped) == table_contents(direct)
    snapshot = latest_snapshot(piped)
    assert snapshot is not None
    assert query_one(snapshot, "SELECT sum(next_offset) FROM offsets") == [(half,)]


class BrokenStore(ProjectionStore):
    """A store whose second write fails."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes = 0

    def write(self, *args: object, **kwargs: object) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ViewStoreError("projection write failed: IO Error: disk full")
        super().write(*args, **kwargs)  # type: ignore[arg-type]


def test_a_failed_commit_surfaces_at_the_next_drain_and_nothing_half_written_remains(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=13, workflows=5))
    db = tmp_path / "p.duckdb"
    with BrokenStore(db) as store:
        pipeline = Pipeline(Projector(store, CODEC, MemoryRecordLetters()))
        pipeline.feed(messages[:10])
        pipeline.feed(messages[10:20])
        with pytest.raises(ViewStoreError, match="disk full"):
            pipeline.drain()
        assert len(pipeline.projector.cache) == 0, "fold states ahead of the store are dropped"
        pipeline.stop()
    assert query_one(db, "SELECT sum(next_offset) FROM offsets") == [(10,)]
    first = {CODEC.decode(m.value).event_id for m in messages[:10]}
    assert query_one(db, "SELECT count(*) FROM events") == [(len(first),)]


class HeldCheckpoint(ProjectionStore):
    """A store whose checkpoints (a snapshot's first step) wait until released."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release = threading.Event()

    def checkpoint(self) -> bool:
        self.entered.set()
        self.release.wait(30)
        return super().checkpoint()


def test_batches_are_prepared_while_the_writer_publishes_a_snapshot(tmp_path: Path) -> None:
    # A snapshot of a large file takes the writer a second or two: the caller goes on
    # preparing (up to the pipeline's depth) instead of waiting for it.
    messages = to_messages(random_log(seed=14, workflows=30))
    parts = list(batches(messages, random.Random(4), 30))
    assert len(parts) > DEFAULT_DEPTH
    db = tmp_path / "p.duckdb"
    store = HeldCheckpoint(db)
    with store:
        pipeline = Pipeline(Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=2))

        def feed_more() -> None:
            for part in parts[1:DEFAULT_DEPTH]:
                pipeline.feed(part)

        pipeline.feed(parts[0])
        pipeline.publish()
        assert store.entered.wait(10)
        fed = threading.Thread(target=feed_more)
        fed.start()
        fed.join(5)
        held = fed.is_alive()
        store.release.set()
        fed.join()
        assert not held, "the caller waited for the snapshot"
        for part in parts[DEFAULT_DEPTH:]:
            pipeline.feed(part)
        pipeline.close()
    direct = tmp_path / "direct.duckdb"
    with ProjectionStore(direct) as direct_store:
        projector = Projector(direct_store, CODEC, MemoryRecordLetters())
        for part in parts:
            projector.process(part)
    assert table_contents(db) == table_contents(direct)


def test_nothing_queued_after_a_failed_commit_is_written(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=15, workflows=5))
    db = tmp_path / "p.duckdb"
    with BrokenStore(db) as store:
        pipeline = Pipeline(Projector(store, CODEC, MemoryRecordLetters()), depth=4)
        for i in range(0, 40, 10):
            pipeline.feed(messages[i : i + 10])
        with pytest.raises(ViewStoreError, match="disk full"):
            pipeline.drain()
        pipeline.stop()
    assert query_one(db, "SELECT sum(next_offset) FROM offsets") == [(10,)]


class HeldWrite(ProjectionStore):
    """A store whose first write waits until released."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, *args: Any, **kwargs: Any) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
        super().write(*args, **kwargs)


def test_records_fed_while_the_writer_commits_wait_for_it_and_go_in_one_batch(
    tmp_path: Path,
) -> None:
    # A transaction costs about the same for ten records as for a thousand: a queue of small
    # batches behind a busy writer made each record wait for every commit ahead of it.
    messages = to_messages(random_log(seed=16, workflows=20))
    parts = list(batches(messages, random.Random(5), 15))
    assert len(parts) > 3
    db = tmp_path / "p.duckdb"
    committed: list[int] = []
    store = HeldWrite(db)
    with store:
        pipeline = Pipeline(
            Projector(store, CODEC, MemoryRecordLetters()),
            on_commit=lambda report: committed.append(report.received),
            batch_size=len(messages),
        )
        pipeline.feed(parts[0])  # the writer is idle: committed at once
        assert store.entered.wait(10)
        for part in parts[1:]:
            pipeline.feed(part)  # the writer is busy: nothing waits here
        store.release.set()
        deadline = time.monotonic() + 30
        while len(committed) < 2 and time.monotonic() < deadline:
            pipeline.pump()  # what the daemon does after every poll
            time.sleep(0.01)
        assert committed == [len(parts[0]), len(messages) - len(parts[0])]
        pipeline.close()
    direct = tmp_path / "direct.duckdb"
    with ProjectionStore(direct) as direct_store:
        Projector(direct_store, CODEC, MemoryRecordLetters()).process(messages)
    assert table_contents(db) == table_contents(direct)


def test_a_full_batch_goes_to_the_writer_without_waiting_for_it_to_be_idle(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=17, workflows=10))
    db = tmp_path / "p.duckdb"
    committed: list[int] = []
    store = HeldWrite(db)
    with store:
        pipeline = Pipeline(
            Projector(store, CODEC, MemoryRecordLetters()),
            on_commit=lambda report: committed.append(report.received),
            batch_size=10,
        )
        pipeline.feed(messages[:3])
        assert store.entered.wait(10)
        pipeline.feed(messages[3:28])  # two full batches queue; 5 records wait
        store.release.set()
        pipeline.drain()
        assert committed == [3, 10, 10, 5]
        pipeline.publish()  # a snapshot holds everything fed before it
        pipeline.feed(messages[28:])
        pipeline.close()
    snapshot = latest_snapshot(db)
    assert snapshot is not None
    assert query_one(snapshot, "SELECT sum(next_offset) FROM offsets") == [(28,)]

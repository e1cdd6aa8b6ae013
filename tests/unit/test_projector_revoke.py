"""Revocation, loss and re-assignment of shards while batches and snapshots are in flight.

Found by a benchmark: under load a lone projector lost its partitions and stopped with
``cannot publish snapshot ...: Cannot CHECKPOINT: there are other write transactions
active``.  DuckDB refuses a ``CHECKPOINT`` while another connection to the database holds a
transaction that began before a committed upsert, and the projector's main thread loaded
workflow histories through such a connection while the writer thread checkpointed.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import cast

import duckdb
import pytest

from stepledger.config import Settings
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ViewStoreError
from stepledger.kafka.consumer import GroupConsumer, Membership
from stepledger.kafka.records import Polled, Where
from stepledger.projector.daemon import ProjectorOptions, _Loop, _on_assign, _on_revoke, _step
from stepledger.projector.engine import Projector
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.shards import ShardDir
from stepledger.projector.store import ProjectionStore
from stepledger.readers.snapshots import shard_path, snapshot_path
from tests.unit.projector_harness import CODEC, batches, to_messages
from tests.unit.projector_logs import random_log

WHERE = ("log", 0)


def make_pipeline(store: ProjectionStore) -> Pipeline:
    # A one-workflow cache: nearly every batch loads histories from the store.
    return Pipeline(Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=1))


def snapshot_offset(shards: Path, where: tuple[str, int] = WHERE) -> int | None:
    """The next offset the shard's published snapshot holds (None: no snapshot)."""
    snap = snapshot_path(shard_path(shards, *where))
    if not snap.exists():
        return None
    con = duckdb.connect(str(snap), read_only=True)
    try:
        row = con.execute("SELECT coalesce(sum(next_offset), 0) FROM offsets").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def test_history_loads_racing_the_writers_snapshots_never_stop_the_pipeline(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=1, workflows=25), partitions=1)
    shards = ShardDir(tmp_path / "s", make_pipeline)
    shards.open([WHERE])
    pipeline = shards.pipeline(WHERE)
    assert pipeline is not None
    fed = 0
    for batch in batches(messages, random.Random(1), 20):
        # Each batch's history loads run while the writer commits and checkpoints the last.
        pipeline.feed(batch)
        pipeline.publish()
        fed += len(batch)
    pipeline.drain()
    assert snapshot_offset(tmp_path / "s") == fed == len(messages)
    shards.close([WHERE])


def test_a_transaction_holding_back_the_checkpoint_defers_the_snapshot_never_the_projector(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=31, workflows=6), partitions=1)
    half = len(messages) // 2
    shards = ShardDir(tmp_path / "s", make_pipeline)
    shards.open([WHERE])
    pipeline = shards.pipeline(WHERE)
    assert pipeline is not None
    pipeline.feed(messages[:half])
    pipeline.publish()
    pipeline.drain()
    assert snapshot_offset(tmp_path / "s") == half

    # Another connection of this process, reading since before the next batch's upserts.
    store = pipeline.projector.store
    assert isinstance(store, ProjectionStore)
    other = store.con.cursor()
    other.execute("BEGIN TRANSACTION")
    other.execute("SELECT count(*) FROM events").fetchall()
    pipeline.feed(messages[half:])
    pipeline.publish()
    pipeline.drain()  # the snapshot is skipped, the batch is committed
    assert snapshot_offset(tmp_path / "s") == half
    # Revoked while that transaction is still open: the shard is given up all the same.
    shards.close([WHERE])
    assert shards.pipeline(WHERE) is None

    again = ShardDir(tmp_path / "s", make_pipeline)
    assert again.open([WHERE]) == {WHERE: len(messages)}
    again.close([WHERE])
    assert snapshot_offset(tmp_path / "s") == len(messages)


class SlowStore(ProjectionStore):
    """A store whose writes wait for a gate (a commit that takes long under load)."""

    gate: threading.Event

    def write(self, *args: object, **kwargs: object) -> None:
        assert self.gate.wait(30), "the test never opened the gate"
        super().write(*args, **kwargs)  # type: ignore[arg-type]


def test_a_shard_assigned_again_while_open_commits_what_is_in_flight_before_its_offsets(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=32, workflows=4), partitions=1)
    gate = threading.Event()

    def slow(path: Path) -> ProjectionStore:
        store = SlowStore(path)
        store.gate = gate
        return store

    shards = ShardDir(tmp_path / "s", make_pipeline, opener=slow)
    shards.open([WHERE])
    pipeline = shards.pipeline(WHERE)
    assert pipeline is not None
    pipeline.feed(messages)
    # The commit is still waiting when the partition is lost and assigned to us again.
    threading.Timer(0.3, gate.set).start()
    assert shards.open([WHERE]) == {WHERE: len(messages)}
    assert shards.pipeline(WHERE) is pipeline, "the open shard is reused, not opened twice"
    assert pipeline.projector.committed == {WHERE: len(messages)}
    shards.close([WHERE])


def test_a_file_this_process_has_open_is_refused_a_second_store_under_any_name(
    tmp_path: Path,
) -> None:
    db = tmp_path / "p.duckdb"
    with ProjectionStore(db) as store:
        (tmp_path / "link.duckdb").symlink_to(db)
        os.link(db, tmp_path / "hard.duckdb")
        names = [db, tmp_path / "link.duckdb", tmp_path / "hard.duckdb", tmp_path / "." / db.name]
        for name in names:
            with pytest.raises(ViewStoreError, match="already open in this process") as refused:
                ProjectionStore(name)
            assert "\n" not in str(refused.value)
        assert store.offsets() == {}
    with ProjectionStore(tmp_path / "link.duckdb") as reopened:
        assert reopened.count("events") == 0


def test_two_shard_dirs_of_one_process_hand_a_shard_over_and_never_share_it(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=33, workflows=4), partitions=1)
    first = ShardDir(tmp_path / "s", make_pipeline)
    first.open([WHERE])
    pipeline = first.pipeline(WHERE)
    assert pipeline is not None
    pipeline.feed(messages)

    # Locked: held back at once (no offset, no pipeline, no wait), not an error.
    stuck = ShardDir(tmp_path / "s", make_pipeline)
    assert stuck.open([WHERE]) == {}
    assert stuck.pipeline(WHERE) is None and stuck.held() == {WHERE}
    assert stuck.take_held() == {} and stuck.held() == {WHERE}
    first.close([WHERE])  # the owner lets it go
    assert stuck.take_held() == {WHERE: len(messages)}
    assert stuck.held() == set() and stuck.pipeline(WHERE) is not None
    stuck.close([WHERE])


class BrokenStore(ProjectionStore):
    """A store whose second write fails (a full disk)."""

    writes = 0

    def write(self, *args: object, **kwargs: object) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ViewStoreError("projection write failed: IO Error: disk full")
        super().write(*args, **kwargs)  # type: ignore[arg-type]


def test_a_revoked_shard_is_released_even_when_committing_another_shard_failed(
    tmp_path: Path,
) -> None:
    messages = to_messages(random_log(seed=34, workflows=12), partitions=2)
    broken, kept = ("log", 0), ("log", 1)

    def opener(path: Path) -> ProjectionStore:
        if path == shard_path(tmp_path / "s", *broken):
            return BrokenStore(path)
        return ProjectionStore(path)

    shards = ShardDir(tmp_path / "s", make_pipeline, opener=opener)
    shards.open([broken, kept])
    for where in (kept, broken):
        pipeline = shards.pipeline(where)
        assert pipeline is not None
        mine = [m for m in messages if (m.topic, m.partition) == where]
        pipeline.feed(mine[:3])
        pipeline.feed(mine[3:6])  # the broken shard's second write fails in its writer
    options = ProjectorOptions(db_path=tmp_path / "s", commit_to_kafka=False)
    consumer = GroupConsumer(Settings(bootstrap="127.0.0.1:9"), Membership(group="g"))
    loop = _Loop(consumer, options, ProjectorMetrics(), None, shards=shards)
    loop.assigned = [broken, kept]

    with pytest.raises(ViewStoreError, match="disk full"):
        _on_revoke(loop, [kept])
    assert shards.pipeline(kept) is None
    assert loop.assigned == [broken]
    with ProjectionStore(shard_path(tmp_path / "s", *kept)) as released:
        assert released.offsets() != {}
    shards.shutdown()


class _HeldConsumer:
    """A consumer whose polls are empty and whose held partitions' seeks are accepted."""

    def __init__(self) -> None:
        self.released: list[tuple[str, int, int]] = []

    def poll(self, size: int, timeout: float) -> Polled:
        return Polled([])

    def release(self, where: Where, offset: int) -> bool:
        self.released.append((*where, offset))
        return True

    def high_watermark(self, where: Where) -> int | None:
        return None


def test_an_assignment_of_a_locked_shard_returns_at_once_and_the_loop_takes_it_soon(
    tmp_path: Path,
) -> None:
    """The member never waits for another owner's lock in its assignment callback."""
    messages = to_messages(random_log(seed=35, workflows=4), partitions=1)
    owner = ShardDir(tmp_path / "s", make_pipeline)
    owner.open([WHERE])
    pipeline = owner.pipeline(WHERE)
    assert pipeline is not None
    pipeline.feed(messages)
    options = ProjectorOptions(db_path=tmp_path / "s", snapshot_interval_s=0)
    consumer = _HeldConsumer()
    loop = _Loop(
        cast(GroupConsumer, consumer),
        options,
        ProjectorMetrics(),
        None,
        shards=ShardDir(tmp_path / "s", make_pipeline),
    )
    began = time.monotonic()
    placed = _on_assign(loop, [WHERE])
    assert time.monotonic() - began < 0.5, "the assignment callback waited for a lock"
    assert list(placed.held) == [WHERE]
    owner.close([WHERE])  # the previous owner lets it go (continued, or killed)
    freed = time.monotonic()
    while not consumer.released and time.monotonic() - freed < 5.0:
        _step(loop)
    assert consumer.released == [(*WHERE, len(messages))]
    assert time.monotonic() - freed < 1.0, "a freed shard waited for the slow retry"
    assert loop.state.held() == set() and loop.state.pipeline(WHERE) is not None
    loop.state.shutdown()

"""Per-partition shards: names, the file lock as the fence, and readers seeing an exact union."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ReadOnlyQueryError, ViewStoreError
from stepledger.kafka.records import Consumed
from stepledger.projector.engine import Projector
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.schema import TABLES, VIEWS
from stepledger.projector.shards import ShardDir
from stepledger.projector.snapshot import readable_source
from stepledger.projector.store import ProjectionStore
from stepledger.readers.query import run_query, workflow_status
from stepledger.readers.snapshots import (
    connect_union,
    freshest_shard_snapshots,
    is_shard_dir,
    shard_of,
    shard_path,
    workflow_events_from_shards,
)
from tests.unit.projector_harness import CODEC, batches, table_contents, to_messages
from tests.unit.projector_logs import random_log

PARTITIONS = 4
#: A view's rows without the columns that age with now().
VIEW_SQL = "SELECT COLUMNS(lambda c: c != 'age') FROM {0} ORDER BY ALL"


def make_pipeline(store: ProjectionStore) -> Pipeline:
    return Pipeline(Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=8))


def feed(shards: ShardDir, messages: list[Consumed]) -> None:
    for batch in batches(messages, random.Random(5), 30):
        for record in batch:
            pipeline = shards.pipeline((record.topic, record.partition))
            assert pipeline is not None
            pipeline.feed([record])


def test_shard_names_round_trip_and_a_path_without_duckdb_suffix_is_a_directory(
    tmp_path: Path,
) -> None:
    path = shard_path(tmp_path, "step.log-v2.p1", 7)
    assert path.name == "step.log-v2.p1.p0007.duckdb"
    assert shard_of(path) == ("step.log-v2.p1", 7)
    assert shard_of(path.with_name("step.log-v2.p1.p0007.snapshot.duckdb")) == (
        "step.log-v2.p1",
        7,
    )
    assert shard_of(tmp_path / "ledger.duckdb") is None
    assert is_shard_dir(tmp_path / "shards") and is_shard_dir(tmp_path)
    assert not is_shard_dir(tmp_path / "ledger.duckdb")


def test_the_union_of_shards_equals_one_file_built_from_the_same_log(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=21, workflows=40), partitions=PARTITIONS)
    single = tmp_path / "one.duckdb"
    with ProjectionStore(single) as store:
        projector = Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=8)
        for batch in batches(messages, random.Random(5), 30):
            projector.process(batch)
    shards = ShardDir(tmp_path / "shards", make_pipeline)
    everything = [("log", p) for p in range(PARTITIONS)]
    assert shards.open(everything) == {}
    assert shards.created == everything
    feed(shards, messages)
    shards.shutdown()

    con = connect_union(tmp_path / "shards")
    try:
        union = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
        views = {v: con.execute(VIEW_SQL.format(v)).fetchall() for v in VIEWS}
    finally:
        con.close()
    assert union == table_contents(single)
    assert sum(len(rows) for rows in union.values()) > 0
    one = run_query(single, "; ".join(VIEW_SQL.format(v) for v in VIEWS))
    assert views == {v: r.rows for v, r in zip(VIEWS, one, strict=True)}
    # Reopened, a shard continues from its own offset: nothing is replayed from 0.
    again = ShardDir(tmp_path / "shards", make_pipeline)
    offsets = again.open(everything)
    assert again.created == []
    assert offsets == {row[:2]: row[2] for row in union["offsets"]}
    again.shutdown()


def test_readers_open_the_union_and_resume_reads_only_its_own_partitions_shard(
    tmp_path: Path,
) -> None:
    log = random_log(seed=22, workflows=12)
    messages = to_messages(log, partitions=PARTITIONS)
    shards = ShardDir(tmp_path / "shards", make_pipeline)
    shards.open([("log", p) for p in range(PARTITIONS)])
    feed(shards, messages)
    shards.shutdown()
    source = readable_source(tmp_path / "shards")
    assert run_query(source, "SELECT sum(next_offset) FROM offsets")[0].rows == [(len(messages),)]
    with pytest.raises(ReadOnlyQueryError):
        run_query(source, "SELECT * FROM read_csv('/etc/hostname')")
    record = messages[0]
    workflow_id = (record.key or b"").decode()
    where = (record.topic, record.partition)
    assert workflow_status(source, workflow_id).workflow["workflow_id"] == workflow_id
    events, offsets, read = workflow_events_from_shards(
        tmp_path / "shards", [where], workflow_id, CODEC
    )
    assert {e.event_id for e in events} == {e.event_id for e in log if e.workflow_id == workflow_id}
    assert list(offsets) == [where] and len(read) == 1


def test_a_locked_shard_is_held_back_at_once_and_never_opened_beside_its_owner(
    tmp_path: Path,
) -> None:
    refusals = [2]

    def opener(path: Path) -> ProjectionStore:
        if refusals[0] > 0:
            refusals[0] -= 1
            raise ViewStoreError("Could not set lock on file: Conflicting lock is held")
        return ProjectionStore(path)

    # The assignment never waits for a lock: held back, then taken by a later try.
    shards = ShardDir(tmp_path / "s", make_pipeline, opener=opener)
    began = time.monotonic()
    assert shards.open([("log", 0)]) == {}
    assert time.monotonic() - began < 0.5, "the assignment waited for a lock"
    assert refusals == [1] and shards.held() == {("log", 0)}
    assert shards.take_held() == {} and refusals == [0]
    assert shards.take_held() == {("log", 0): None}
    assert shards.pipeline(("log", 0)) is not None and shards.held() == set()
    shards.shutdown()

    def held(path: Path) -> ProjectionStore:
        raise ViewStoreError("Could not set lock on file: Conflicting lock is held")

    stuck = ShardDir(tmp_path / "s", make_pipeline, opener=held)
    began = time.monotonic()
    assert stuck.open([("log", p) for p in range(4)]) == {}
    assert time.monotonic() - began < 0.5, "the assignment waited for a lock"
    assert stuck.pipeline(("log", 0)) is None and len(stuck.held()) == 4
    stuck.close([("log", 0)])  # revoked while held: just let go
    assert stuck.held() == {("log", p) for p in range(1, 4)}

    def broken(path: Path) -> ProjectionStore:
        raise ViewStoreError("cannot open projection: not a DuckDB file")

    # Anything but a lock is not held back.
    with pytest.raises(ViewStoreError, match="not a DuckDB file"):
        ShardDir(tmp_path / "s", make_pipeline, opener=broken).open([("log", 0)])


def test_several_directories_read_each_partitions_freshest_shard(tmp_path: Path) -> None:
    """No shared volume: a member that lost partitions leaves stale shards behind."""
    messages = to_messages(random_log(seed=23, workflows=12), partitions=PARTITIONS)
    single = tmp_path / "one.duckdb"
    with ProjectionStore(single) as store:
        Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=8).process(messages)
    everything = [("log", p) for p in range(PARTITIONS)]
    # The stale member projected half the log, the fresh one (listed last) all of it.
    for name, upto in (("stale", len(messages) // 2), ("fresh", len(messages))):
        shards = ShardDir(tmp_path / name, make_pipeline)
        shards.open(everything)
        feed(shards, messages[:upto])
        shards.shutdown()
    chosen = freshest_shard_snapshots(tmp_path / "stale", tmp_path / "fresh")
    assert {path.parent.name for path in chosen.values()} == {"fresh"}
    con = connect_union(tmp_path / "stale", tmp_path / "fresh")
    try:
        union = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()
    assert union == table_contents(single)
    stale = connect_union(tmp_path / "stale")
    try:
        assert stale.execute("SELECT count(*) FROM events").fetchone() != (len(messages),)
    finally:
        stale.close()
    with pytest.raises(ViewStoreError, match="no shard snapshot"):
        connect_union(tmp_path / "nothing-here")

"""The projector into a DuckLake (real PostgreSQL catalog, S3 from moto, the test broker).

The lake is a second implementation of the projector's one store boundary, so the rows it
holds must be the file's rows: the same log projected both ways gives the same tables, a
restart resumes from the lake's offsets, and a rebuild into a fresh lake equals the
incremental build.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ConfigError
from stepledger.projector.boundary import ViewStore
from stepledger.projector.daemon import ProjectorOptions
from stepledger.projector.engine import Projector
from stepledger.projector.lake import LakeDatabase, LakeFencedError, LakeStore
from stepledger.projector.lake_shards import LakeShards
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.rebuild_lake import rebuild_lake
from stepledger.projector.schema import TABLES
from stepledger.projector.store import stage
from stepledger.readers.lake import (
    LakeConfig,
    LakeSource,
    connect_lake,
    schema_name,
    table_name,
)
from stepledger.readers.query import run_query, workflow_status
from stepledger_dev.lake_stack import LakeStack
from tests.conftest import Factory
from tests.integration.projector_helpers import cli, produce_events, projecting
from tests.integration.test_retention import delete_head, kafka_only
from tests.lake.conftest import lake_offsets, read_lake
from tests.unit.projector_harness import table_contents, to_messages
from tests.unit.projector_logs import random_log


def test_the_lake_holds_what_the_file_holds(
    settings: Settings, lake: LakeConfig, tmp_path: Path
) -> None:
    log = random_log(7, 40)
    sent = produce_events(settings, log)
    db = tmp_path / "p.duckdb"
    with projecting(settings, db) as daemon:
        daemon.wait_received(sent)
    with projecting(settings, tmp_path / "unused.duckdb", lake=lake, group="lake-a") as daemon:
        daemon.wait_received(sent)
    assert read_lake(lake, settings.topic) == table_contents(db)
    assert sum(lake_offsets(lake, settings.topic).values()) == sent
    # The analysts' read path: SQL and one workflow's steps, from the lake.
    source = LakeSource(lake, settings.topic)
    [result] = run_query(source, "SELECT count(*) AS n FROM steps")
    assert result.rows == [(len(table_contents(db)["steps"]),)]
    wf = log[0].workflow_id
    assert workflow_status(source, wf).workflow["workflow_id"] == wf


def test_a_file_projector_and_a_lake_projector_on_defaults_each_project_every_partition(
    make_settings: Factory, lake: LakeConfig, tmp_path: Path
) -> None:
    # Both on their default groups: a lake's projectors have one of their own, so neither
    # takes partitions from the other (on one group each would see about half the log).
    settings = make_settings(partitions=4)
    db = tmp_path / "p.duckdb"
    with (
        projecting(settings, db, group="") as file_daemon,
        projecting(settings, tmp_path / "unused.duckdb", lake=lake, group="") as lake_daemon,
    ):
        sent = produce_events(settings, random_log(23, 24))
        file_daemon.wait_received(sent, timeout=45)
        lake_daemon.wait_received(sent, timeout=45)
    assert ProjectorOptions(lake=lake).for_settings(settings).group == (
        f"{settings.topic}.lake-projector"
    )
    assert ProjectorOptions().for_settings(settings).group == f"{settings.topic}.projector"
    assert sum(lake_offsets(lake, settings.topic).values()) == sent
    assert read_lake(lake, settings.topic) == table_contents(db)


def test_the_command_line_queries_a_lake_and_rebuilds_into_a_fresh_one(
    settings: Settings, stack: LakeStack, lake: LakeConfig, src_env: dict[str, str]
) -> None:
    sent = produce_events(settings, random_log(17, 8))
    env = {**src_env, **stack.env()}
    fresh = stack.new_lake()
    common = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    into = ["--lake", fresh.catalog, "--data-path", fresh.data_path, "--no-progress"]
    rebuilt = cli(env, "rebuild", *common, "--dlq-topic", settings.dlq_topic, *into)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert f"rebuilt the lake's tables of {settings.topic}: {sent} records" in rebuilt.stdout
    sql = "SELECT sum(next_offset) AS n, (SELECT count(*) FROM workflows) AS w FROM offsets"
    asked = cli(env, "query", "--lake", fresh.catalog, "--topic", settings.topic, "--json", sql)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == [{"n": sent, "w": 8}]
    shown = cli(
        env, "status", "--lake", fresh.catalog, "--topic", settings.topic, "--json", "wf-17-0000"
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["workflow"]["workflow_id"] == "wf-17-0000"
    # A lake that holds the log already is refused in one line.
    again = cli(env, "rebuild", *common, "--lake", fresh.catalog, "--no-progress")
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"Error: the lake already holds {3 * len(TABLES)} table(s) of step log {settings.topic} "
        f"(schema {schema_name(settings.topic)}): rebuild into a fresh lake "
        "(another catalog database)"
    ]


def test_a_restarted_projector_resumes_from_the_lake_and_a_rebuild_equals_it(
    settings: Settings, stack: LakeStack, lake: LakeConfig, tmp_path: Path
) -> None:
    log = random_log(11, 60)
    half = len(log) // 2
    unused = tmp_path / "unused.duckdb"
    first = produce_events(settings, log[:half])
    with projecting(settings, unused, lake=lake) as daemon:
        daemon.wait_received(first)
    rest = produce_events(settings, log[half:])
    with projecting(settings, unused, lake=lake) as daemon:
        daemon.wait_received(rest)
        # Nothing below the lake's offsets was read again.
        assert daemon.received == rest
    incremental = read_lake(lake, settings.topic)
    assert sum(lake_offsets(lake, settings.topic).values()) == len(log)

    fresh = stack.new_lake()
    report = rebuild_lake(settings, fresh)
    assert report.records == len(log)
    assert read_lake(fresh, settings.topic) == incremental
    with pytest.raises(ConfigError, match="rebuild into a fresh lake"):
        rebuild_lake(settings, fresh)


def _batch(topic: str, partition: int, reached: int, event_id: str) -> dict[str, pa.Table]:
    rows: dict[str, list[Any]] = {
        "topic": [topic],
        "partition": [partition],
        "expected_offset": [reached],
        "log_start": [reached],
        "records_lost": [0],
        "detected_at": [None],
        "detected_by": [event_id],
    }
    return stage({"gaps": rows}, {(topic, partition): reached})


def test_a_writer_whose_partition_moved_commits_nothing(lake: LakeConfig) -> None:
    db = LakeDatabase(lake, "log-z")
    zombie = LakeStore(db, "log-z", 0)
    owner = LakeStore(db, "log-z", 0)
    try:
        assert zombie.offsets() == {} and owner.offsets() == {}
        zombie.write(_batch("log-z", 0, 5, "zombie"), [])
        # The new owner read the offset (5) on assignment and commits on from there.
        assert owner.offsets() == {("log-z", 0): 5}
        owner.write(_batch("log-z", 0, 9, "owner"), [])
        # The zombie's next batch started at 5: the lake is at 9, so nothing lands.
        with pytest.raises(LakeFencedError, match="another projector owns the partition"):
            zombie.write(_batch("log-z", 0, 7, "late"), [])
        assert owner.offsets() == {("log-z", 0): 9}
        writers = owner._read(f"SELECT detected_by FROM {owner.names['gaps']} ORDER BY 1", [])
        assert writers == [("owner",), ("zombie",)]
    finally:
        zombie.close()
        owner.close()
        db.close()


@kafka_only
def test_a_gap_below_the_log_start_is_a_row_in_the_lake(
    make_settings: Factory, lake: LakeConfig, tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    log = random_log(41, 20)
    unused = tmp_path / "unused.duckdb"
    with projecting(settings, unused, lake=lake) as daemon:
        daemon.wait_received(produce_events(settings, log[:30]))
    produce_events(settings, log[30:50])  # projected by nobody: the projector is down
    assert delete_head(settings, 0) == 50
    with projecting(settings, unused, lake=lake) as daemon:
        daemon.wait_received(produce_events(settings, log[50:]))
    found = read_lake(lake, settings.topic)
    assert [row[:5] for row in found["gaps"]] == [(settings.topic, 0, 30, 50, 20)]
    read = {row[9] for row in found["events"]}  # log_offset
    assert min(read) < 30 and max(read) >= 50 and not read & set(range(30, 50))
    assert lake_offsets(lake, settings.topic) == {(settings.topic, 0): len(log)}


def test_an_analyst_with_a_select_only_role_reads_the_lake_and_writes_nothing(
    settings: Settings, stack: LakeStack, lake: LakeConfig, tmp_path: Path
) -> None:
    sent = produce_events(settings, random_log(51, 10))
    with projecting(settings, tmp_path / "unused.duckdb", lake=lake) as daemon:
        daemon.wait_received(sent)
    database = lake.catalog.rsplit("dbname=", 1)[1]
    # The role of docs/operators.md: it reads the catalog's tables and nothing else.
    for statement in (
        "CREATE ROLE analyst LOGIN",
        "GRANT USAGE ON SCHEMA public TO analyst",
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO analyst",
    ):
        stack.postgres.sql(database, statement)
    analyst = replace(lake, catalog=lake.catalog.replace("user=postgres", "user=analyst"))
    source = LakeSource(analyst, settings.topic)
    [result] = run_query(source, "SELECT sum(next_offset) FROM offsets")
    assert result.rows == [(sent,)]
    con = connect_lake(analyst, read_only=False)
    try:
        with pytest.raises(duckdb.Error):
            con.execute(f"CREATE TABLE lake.{schema_name(settings.topic)}.mine (x INTEGER)")
    finally:
        con.close()
    assert sum(lake_offsets(lake, settings.topic).values()) == sent


def test_the_owner_compacts_its_tables_and_expires_old_snapshots(lake: LakeConfig) -> None:
    db = LakeDatabase(lake, "log-c", compact_every_s=0, expire_every_s=0, keep_snapshots_s=0)
    store = LakeStore(db, "log-c", 0)
    try:
        store.offsets()
        for reached in range(1, 6):
            store.write(_batch("log-c", 0, reached, f"batch-{reached}"), [])
        table = store.names["gaps"].rsplit(".", 1)[1].strip('"')

        def files() -> int:
            sql = "SELECT count(*) FROM ducklake_list_files('lake', ?, schema => ?)"
            return int(store._read(sql, [table, db.schema])[0][0])

        before = files()
        assert store.publish() == f"compacted {store.path}"
        assert before > 1 and files() == 1  # a file per batch, then one
        assert store.count("gaps") == 5
        assert store.offsets() == {("log-c", 0): 5}
    finally:
        store.close()
        db.close()


def test_a_paused_owner_gives_up_its_partition_without_error_after_a_refused_batch(
    lake: LakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    db = LakeDatabase(lake, "log-f")

    def make(store: ViewStore) -> Pipeline:
        return Pipeline(Projector(store, Codec(), MemoryRecordLetters(), group="g"))

    zombie = LakeShards(db, make)
    owner = LakeStore(db, "log-f", 0)
    try:
        assert zombie.open([("log-f", 0)]) == {}
        assert owner.offsets() == {}
        # The new owner commits first; the paused one's batch (also from 0) comes late.
        owner.write(_batch("log-f", 0, 3, "owner"), [])
        pipeline = zombie.pipeline(("log-f", 0))
        assert pipeline is not None
        pipeline.feed(to_messages(random_log(3, 2), topic="log-f", partitions=1))
        caplog.set_level(logging.WARNING, logger="stepledger")
        zombie.close([("log-f", 0)])  # as the daemon does when the group says it was lost
        assert "nothing committed after the partition moved" in caplog.text
        assert owner.count("events") == 0
        assert owner.offsets() == {("log-f", 0): 3}
    finally:
        owner.close()
        zombie.shutdown()


def test_a_lake_written_by_an_older_schema_gets_the_new_tables_and_columns(
    lake: LakeConfig,
) -> None:
    db = LakeDatabase(lake, "log-m")
    old = LakeStore(db, "log-m", 0)
    LakeStore(db, "log-m", 1).close()
    old.write(_batch("log-m", 0, 4, "before"), [])
    old.close()
    steps, calls = (
        db.qualified(table_name(t, "log-m", "log-m", 0)) for t in ("steps", "model_calls")
    )
    con = db.cursor()
    try:
        # As an older stepledger left it: no app_version column, no model_calls table.
        con.execute(f"ALTER TABLE {steps} DROP COLUMN app_version")
        con.execute(f"DROP TABLE {calls}")
    finally:
        con.close()
    store = LakeStore(db, "log-m", 0)
    try:
        assert store.offsets() == {("log-m", 0): 4}
        assert store.count("model_calls") == 0
        assert store._read(f"SELECT count(*) FROM {store.names['offsets']}", []) == [(1,)]
        store.write(_batch("log-m", 0, 6, "after"), [])
        view = db.qualified("steps")
        columns = [str(r[0]) for r in store._read(f"DESCRIBE {view}", [])]
        assert columns[-1] == "app_version"
    finally:
        store.close()
        db.close()


def test_projectors_started_at_once_on_a_fresh_lake_all_attach_it(lake: LakeConfig) -> None:
    # Each creates the fresh lake's catalog tables; all but one lose on PostgreSQL's unique
    # constraints ("duplicate key value"), and must attach the catalog the winner made.
    ready = threading.Barrier(4)
    attached: list[object] = []
    failed: list[BaseException] = []

    def attach() -> None:
        ready.wait(10)
        try:
            attached.append(connect_lake(lake, read_only=False))
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=attach) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for con in attached:
        con.close()  # type: ignore[attr-defined]
    assert failed == [] and len(attached) == 4

"""Read-only queries, snapshots, workflow status and dead-letter selection (no broker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from stepledger.cli import cli
from stepledger.deadletters.readback import StoredLetter, parse_position, select_letters
from stepledger.errors import ConfigError, ReadOnlyQueryError, ViewStoreError
from stepledger.kafka import Position
from stepledger.projector.snapshot import (
    latest_snapshot,
    publish_snapshot,
    readable_source,
    snapshot_path,
    workflow_events_from_snapshot,
)
from stepledger.projector.store import ProjectionStore
from stepledger.readers.query import (
    QueryResult,
    check_read_only,
    run_query,
    to_csv,
    to_json,
    workflow_status,
)
from tests.unit.projector_harness import project, to_messages
from tests.unit.projector_logs import random_log

READS = [
    "SELECT 1",
    "WITH x AS (SELECT 1) SELECT * FROM x",
    "FROM steps",
    "DESCRIBE steps",
    "SUMMARIZE steps",
    "EXPLAIN SELECT * FROM steps",
    "SELECT 1; SELECT 2",
]
WRITES = [
    "INSERT INTO steps (workflow_id) VALUES ('x')",
    "UPDATE steps SET status = 'succeeded'",
    "DELETE FROM events",
    "CREATE TABLE t (a INT)",
    "CREATE TEMP TABLE t AS SELECT 1",
    "DROP VIEW open_intents",
    "ALTER TABLE steps ADD COLUMN x INT",
    "COPY steps TO 'steps.csv'",
    "EXPORT DATABASE 'dump'",
    "ATTACH 'other.duckdb'",
    "DETACH other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "CHECKPOINT",
    "BEGIN TRANSACTION",
    "VACUUM",
    "SELECT 1; DELETE FROM events",
]


@pytest.mark.parametrize("sql", READS)
def test_reads_pass_the_check(sql: str) -> None:
    assert check_read_only(sql)


@pytest.mark.parametrize("sql", WRITES)
def test_anything_else_is_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match="refused"):
        check_read_only(sql)


def test_bad_or_empty_sql_is_a_view_store_error() -> None:
    with pytest.raises(ViewStoreError, match="invalid SQL"):
        check_read_only("SELEC nothing")
    with pytest.raises(ViewStoreError, match="no SQL"):
        check_read_only("  -- only a comment")


@pytest.fixture
def projection(tmp_path: Path) -> Path:
    db = tmp_path / "ledger.duckdb"
    project(db, to_messages(random_log(seed=5, workflows=8)))
    return db


def test_a_select_cannot_read_or_write_files(projection: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    with pytest.raises(ReadOnlyQueryError, match="refused"):
        run_query(projection, f"SELECT * FROM read_text('{secret}')")
    # A bare path is not even looked up as a file once file access is off.
    with pytest.raises(ViewStoreError, match="does not exist"):
        run_query(projection, f"SELECT * FROM '{secret}'")


def test_queries_return_every_statement_and_format(projection: Path) -> None:
    first, second = run_query(projection, "SELECT count(*) AS n FROM workflows; FROM tool_stats")
    assert first.columns == ["n"] and first.rows == [(8,)]
    assert "success_rate" in second.columns and second.rows
    result = QueryResult(
        ["at", "blob", "none"], [(datetime(2026, 1, 1, tzinfo=UTC), b"\x01\xff", None)]
    )
    assert to_csv(result) == "at,blob,none\n2026-01-01T00:00:00+00:00,01ff,\n"
    assert to_json(result) == '[{"at": "2026-01-01T00:00:00+00:00", "blob": "01ff", "none": null}]'


def test_every_view_runs(projection: Path) -> None:
    for view in ("open_intents", "unresolved_escalations", "tool_stats", "fleet_summary"):
        assert run_query(projection, f"SELECT * FROM {view}")[0].columns


def test_snapshots_are_published_atomically_next_to_the_file(projection: Path) -> None:
    assert latest_snapshot(projection) is None
    assert readable_source(projection) == projection
    with ProjectionStore(projection) as store:
        target = publish_snapshot(store)
        assert target == snapshot_path(projection) == projection.with_name("ledger.snapshot.duckdb")
        reader = duckdb.connect(str(target), read_only=True)
        before = reader.execute("SELECT count(*) FROM events").fetchone()
        store.con.execute("DELETE FROM events")
        publish_snapshot(store)
        # A reader keeps the version it opened; a new reader sees the new one.
        assert reader.execute("SELECT count(*) FROM events").fetchone() == before
        reader.close()
    assert latest_snapshot(projection) == target
    assert readable_source(projection) == target
    assert run_query(target, "SELECT count(*) FROM events")[0].rows == [(0,)]
    assert not list(projection.parent.glob("*.partial"))


def test_a_workflow_is_read_back_from_a_snapshot_with_its_offsets(tmp_path: Path) -> None:
    log = random_log(seed=6, workflows=5)
    db = tmp_path / "ledger.duckdb"
    messages = to_messages(log)
    project(db, messages)
    with ProjectionStore(db) as store:
        snap = publish_snapshot(store)
    assert snap is not None
    workflow_id = log[0].workflow_id
    events, offsets = workflow_events_from_snapshot(snap, workflow_id)
    seen: set[str] = set()
    expected = []
    for event in log:
        if event.workflow_id == workflow_id and event.event_id not in seen:
            seen.add(event.event_id)
            expected.append(event)
    assert events == expected
    ends: dict[tuple[str, int], int] = {}
    for m in messages:
        ends[(m.topic, m.partition)] = m.offset + 1
    assert offsets == ends


def test_status_lists_steps_in_sequence_and_unknown_workflows_fail(projection: Path) -> None:
    workflow_id = run_query(projection, "SELECT min(workflow_id) FROM workflows")[0].rows[0][0]
    found = workflow_status(projection, workflow_id)
    assert found.workflow["workflow_id"] == workflow_id
    sequences = [s["sequence"] for s in found.steps]
    assert sequences == sorted(sequences) and len(sequences) == found.workflow["steps"]
    with pytest.raises(ViewStoreError, match="not in the projection"):
        workflow_status(projection, "no-such-workflow")


def test_a_missing_projection_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ViewStoreError, match="no projection"):
        readable_source(tmp_path / "nothing.duckdb")


def letter(partition: int, offset: int, stage: str) -> StoredLetter:
    return StoredLetter(Position("dlq", partition, offset), b"k", b"v", [], {"stage": stage})


def test_dead_letters_are_picked_by_position_stage_or_all() -> None:
    letters = [letter(0, 0, "decode"), letter(0, 1, "validate"), letter(1, 0, "decode")]
    assert parse_position("1:0") == (1, 0)
    with pytest.raises(ConfigError):
        parse_position("1-0")
    with pytest.raises(ConfigError, match="--all"):
        select_letters(letters)
    assert select_letters(letters, positions=[(1, 0)]) == [letters[2]]
    assert select_letters(letters, stage="decode") == [letters[0], letters[2]]
    assert select_letters(letters, everything=True) == letters
    assert select_letters(letters, positions=[(0, 1)], stage="decode") == []


def test_the_query_command_reads_files_formats_and_refuses_writes(tmp_path: Path) -> None:
    db = tmp_path / "ledger.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t AS SELECT 1 AS a")
    con.close()
    sql_file = tmp_path / "q.sql"
    sql_file.write_text("-- a comment\nSELECT a, a + 1 AS b FROM t;\n")
    runner = CliRunner()
    csv = runner.invoke(cli, ["query", "--db", str(db), "--file", str(sql_file), "--format", "csv"])
    assert csv.exit_code == 0 and csv.output == "a,b\n1,2\n"
    as_json = runner.invoke(cli, ["query", "--db", str(db), "--format", "json", "FROM t"])
    assert as_json.output.strip() == '[{"a": 1}]'
    for statement in ("INSERT INTO t VALUES (2)", "ATTACH 'x.db'", "SELECT 1; DROP TABLE t"):
        refused = runner.invoke(cli, ["query", "--db", str(db), statement])
        assert isinstance(refused.exception, ReadOnlyQueryError), statement
    both = runner.invoke(cli, ["query", "--db", str(db), "--file", str(sql_file), "SELECT 1"])
    assert both.exit_code == 2 and "not both" in both.output
    assert run_query(db, "SELECT count(*) FROM t")[0].rows == [(1,)]

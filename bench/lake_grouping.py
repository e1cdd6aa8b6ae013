"""How the lake's tables are grouped: a table per partition, per group of partitions, or one.

``python -m bench.lake --grouping`` runs it (:mod:`bench.lake`).  DuckLake detects commit
conflicts per table, so the grouping trades writers' conflicts against the analysts' views:
``partition`` (one table per partition, what :mod:`stepledger.projector.lake` makes),
``groups`` (``GROUPS`` tables, partition ``p`` in table ``p % GROUPS``) and ``shared`` (one
table).  For each layout, ``WRITERS`` writer threads (each with its own connection, as
projectors are) own the partitions of a seeded random assignment (what a group's
assignment looks like: a table of a group is written by several owners) and commit batches
of rows with the batch's partition offset, guarded as the store guards it, in one
transaction, trying again after a conflict; then an analyst's point query (one workflow)
and full aggregate through the ``UNION ALL`` view, before and after compacting each table.

Rows are a narrow steps-like table, not the projector's whole batch: the figure is what the
grouping costs DuckLake, the same for every layout.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from bench.common import Row, median, percentile
from stepledger.readers.lake import LakeConfig, connect_lake

LAYOUTS = ("partition", "groups", "shared")
GROUPS = 16
WRITERS = 4
SCHEMA = "grouping"
#: Conflicts in a row after which a writer gives up a batch (counted, never silent).
MAX_TRIES = 50
POINT = "SELECT * FROM steps WHERE workflow_id = ? ORDER BY log_offset"
AGGREGATE = "SELECT tool, status, count(*), avg(duration_ms) FROM steps GROUP BY ALL"
REPEATS = 5


@dataclass
class Layout:
    """One layout's run: what the writers saw and what the analyst's queries took."""

    name: str
    tables: int
    commits: list[float] = field(default_factory=list)
    retries: int = 0
    gave_up: int = 0
    seconds: float = 0.0
    point: float = 0.0
    aggregate: float = 0.0
    point_compacted: float = 0.0
    aggregate_compacted: float = 0.0
    compaction: float = 0.0


def table_of(layout: str, partition: int) -> int:
    """The table (its number) a partition's rows go to."""
    if layout == "partition":
        return partition
    return partition % GROUPS if layout == "groups" else 0


def _batch(partition: int, start: int, size: int) -> pa.Table:
    rng = random.Random(partition * 1_000_003 + start)
    offsets = list(range(start, start + size))
    return pa.table(
        {
            "workflow_id": [f"wf-{partition}-{o // 4}" for o in offsets],
            "step_id": [f"s{o % 4}" for o in offsets],
            "tool": [f"tool-{rng.randrange(8)}" for _ in offsets],
            "status": [rng.choice(("succeeded", "failed", "intended")) for _ in offsets],
            "duration_ms": [rng.randrange(2_000) for _ in offsets],
            "partition": pa.array([partition] * size, pa.int32()),
            "log_offset": pa.array(offsets, pa.int64()),
        }
    )


def _create(con: duckdb.DuckDBPyConnection, layout: str, partitions: int) -> int:
    tables = sorted({table_of(layout, p) for p in range(partitions)})
    con.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{SCHEMA}_{layout}")
    for t in tables:
        con.execute(
            f"CREATE TABLE lake.{SCHEMA}_{layout}.steps_{t} (workflow_id VARCHAR, "
            "step_id VARCHAR, tool VARCHAR, status VARCHAR, duration_ms BIGINT, "
            "partition INTEGER, log_offset BIGINT)"
        )
        con.execute(
            f"CREATE TABLE lake.{SCHEMA}_{layout}.offsets_{t} "
            "(partition INTEGER, next_offset BIGINT)"
        )
    for p in range(partitions):
        t = table_of(layout, p)
        con.execute(f"INSERT INTO lake.{SCHEMA}_{layout}.offsets_{t} VALUES ({p}, 0)")
    union = " UNION ALL ".join(f"SELECT * FROM lake.{SCHEMA}_{layout}.steps_{t}" for t in tables)
    con.execute(f"CREATE VIEW lake.{SCHEMA}_{layout}.steps AS {union}")
    return len(tables)


def _writer(
    lake: LakeConfig, layout: str, owned: list[int], batches: int, size: int, out: Layout
) -> None:
    con = connect_lake(lake, read_only=False)
    lock = threading.Lock()
    try:
        for b in range(batches):
            for p in owned:
                t = table_of(layout, p)
                rows = _batch(p, b * size, size)
                for _ in range(MAX_TRIES):
                    began = time.perf_counter()
                    try:
                        con.execute("BEGIN TRANSACTION")
                        con.register("rows", rows)
                        con.execute(
                            f"INSERT INTO lake.{SCHEMA}_{layout}.steps_{t} SELECT * FROM rows"
                        )
                        con.execute(
                            f"UPDATE lake.{SCHEMA}_{layout}.offsets_{t} SET next_offset = ? "
                            "WHERE partition = ? AND next_offset = ?",
                            [(b + 1) * size, p, b * size],
                        )
                        con.execute("COMMIT")
                        with lock:
                            out.commits.append(time.perf_counter() - began)
                        break
                    except duckdb.TransactionException:
                        _rollback(con)  # a failed COMMIT has ended the transaction already
                        with lock:
                            out.retries += 1
                    finally:
                        con.unregister("rows")
                else:
                    out.gave_up += 1
    finally:
        con.close()


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK")


def _timed(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> float:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        con.execute(sql, params).fetchall()
        times.append(time.perf_counter() - began)
    return median(times)


def _queries(lake: LakeConfig, layout: str) -> tuple[float, float]:
    con = connect_lake(lake, read_only=True)
    try:
        con.execute(f"USE lake.{SCHEMA}_{layout}")
        return _timed(con, POINT, ["wf-3-10"]), _timed(con, AGGREGATE, [])
    finally:
        con.close()


def _compact(lake: LakeConfig, layout: str) -> float:
    con = connect_lake(lake, read_only=False)
    began = time.perf_counter()
    try:
        names = [
            str(n)
            for (n,) in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' "
                "AND schema_name = ?",
                [f"{SCHEMA}_{layout}"],
            ).fetchall()
        ]
        for name in names:
            args = ["lake", name, f"{SCHEMA}_{layout}"]
            con.execute("CALL ducklake_merge_adjacent_files(?, ?, schema => ?)", args)
            con.execute("CALL ducklake_rewrite_data_files(?, ?, schema => ?)", args)
        return time.perf_counter() - began
    finally:
        con.close()


def measure(lake: LakeConfig, layout: str, partitions: int, rows: int, size: int) -> Layout:
    """Write ``rows`` rows over ``partitions`` with ``WRITERS`` writers in one layout."""
    con = connect_lake(lake, read_only=False)
    try:
        tables = _create(con, layout, partitions)
    finally:
        con.close()
    out = Layout(layout, tables)
    owners = list(range(partitions))
    random.Random(7).shuffle(owners)
    owned = [sorted(owners[w::WRITERS]) for w in range(WRITERS)]
    batches = max(1, rows // (partitions * size))
    began = time.perf_counter()
    threads = [
        threading.Thread(target=_writer, args=(lake, layout, mine, batches, size, out))
        for mine in owned
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.seconds = time.perf_counter() - began
    out.point, out.aggregate = _queries(lake, layout)
    out.compaction = _compact(lake, layout)
    out.point_compacted, out.aggregate_compacted = _queries(lake, layout)
    return out


def rows_of(layouts: list[Layout], partitions: int, rows: int) -> list[Row]:
    """The bench's rows: each layout against one table per partition."""
    base = next(x for x in layouts if x.name == "partition")
    ms = 1000.0
    found: list[Row] = []
    for x in layouts:
        what = f"{x.name} ({x.tables} tables, {partitions} partitions, {WRITERS} writers)"
        found += [
            Row(
                "lake_grouping",
                f"{what}: retries / commits",
                x.retries,
                len(x.commits),
                "n",
                "",
                False,
            ),
            Row("lake_grouping", f"{what}: gave up", x.gave_up, None, "batches", "", False),
            Row(
                "lake_grouping",
                f"{what}: commit p50",
                percentile(x.commits, 50) * ms,
                percentile(base.commits, 50) * ms,
                "ms",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: commit p95",
                percentile(x.commits, 95) * ms,
                percentile(base.commits, 95) * ms,
                "ms",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: rows/s written",
                rows / x.seconds if x.seconds else 0,
                rows / base.seconds if base.seconds else None,
                "rows/s",
            ),
            Row(
                "lake_grouping",
                f"{what}: point query",
                x.point * ms,
                base.point * ms,
                "ms",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: aggregate",
                x.aggregate * ms,
                base.aggregate * ms,
                "ms",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: compaction",
                x.compaction,
                base.compaction,
                "s",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: point query compacted",
                x.point_compacted * ms,
                base.point_compacted * ms,
                "ms",
                "",
                False,
            ),
            Row(
                "lake_grouping",
                f"{what}: aggregate compacted",
                x.aggregate_compacted * ms,
                base.aggregate_compacted * ms,
                "ms",
                "",
                False,
            ),
        ]
    return found

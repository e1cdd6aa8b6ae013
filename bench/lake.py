"""The projector into a DuckLake against the projector into a file, same records, same run.

- events/s per projector, and each batch's time from its preparation to its commit (the
  lake's commit is a PostgreSQL transaction and Parquet files in the bucket; the file's a
  DuckDB transaction on local disk);
- an analyst's point query (one workflow's steps) and aggregate query (steps per tool and
  status, over every partition's table) through ``ATTACH ... (READ_ONLY)``, before and after
  the owner's compaction, and what the compaction cost.

PostgreSQL 15 and ``moto_server`` on loopback (:mod:`stepledger_dev.lake_stack`).  Needs the
``[lake]`` extra's DuckDB (1.5.5): elsewhere it says why and measures nothing.

``python -m bench.lake [--quick] [--events N] [--bootstrap HOST:PORT]``; ``--grouping``
measures the table grouping instead (:mod:`bench.lake_grouping`); ``--query-only [--events
N] [--budget S]`` the queries on a lake of 10M events filled without Kafka
(:mod:`bench.lake_query`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import Row, broker, fresh_settings, median, percentile, produce_bulk
from bench.projector import projector_rate, workload
from stepledger.errors import ConfigError
from stepledger.projector.daemon import ProjectorOptions
from stepledger.projector.engine import BatchReport
from stepledger.readers.lake import (
    LakeConfig,
    connect_lake,
    connect_lake_reader,
    extension_directory,
    schema_name,
)
from stepledger_dev.lake_stack import LakeStack, lake_stack

PARTITIONS = 8
#: Queries are timed this many times each; the median is the row.
REPEATS = 7
POINT = "SELECT * FROM steps WHERE workflow_id = ? ORDER BY sequence"
AGGREGATE = "SELECT tool, status, count(*), avg(duration_ms) FROM steps GROUP BY ALL"


def _timed(con: Any, sql: str, params: list[Any]) -> float:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        con.execute(sql, params).fetchall()
        times.append(time.perf_counter() - began)
    return median(times)


def analyst_queries(lake: LakeConfig, log: str) -> tuple[float, float, str]:
    """(point, aggregate) medians through a read-only attach, and the workflow pointed at."""
    con = connect_lake_reader(lake, log)
    try:
        row = con.execute("SELECT workflow_id FROM workflows LIMIT 1").fetchone()
        workflow = str(row[0]) if row else ""
        return _timed(con, POINT, [workflow]), _timed(con, AGGREGATE, []), workflow
    finally:
        con.close()


def analyst_rows(lake: LakeConfig, log: str) -> list[Row]:
    """An analyst's point and aggregate queries, the owners' compaction, the queries again:
    the rows every lake bench reports, however its lake was filled."""
    ms = 1000.0
    point, aggregate, _ = analyst_queries(lake, log)
    compaction, before, after = compact_tables(lake, log)
    point_after, aggregate_after, _ = analyst_queries(lake, log)

    def row(measure: str, value: float, unit: str) -> Row:
        return Row("lake", measure, value, None, unit, "", False)

    return [
        row(f"point query, one workflow's steps ({before} files)", point * ms, "ms"),
        row(f"aggregate over steps, every partition ({before} files)", aggregate * ms, "ms"),
        row(f"compaction of every table ({before} -> {after} files)", compaction, "s"),
        row("point query after compaction", point_after * ms, "ms"),
        row("aggregate after compaction", aggregate_after * ms, "ms"),
    ]


def compact_tables(lake: LakeConfig, log: str) -> tuple[float, int, int]:
    """Compact every table of the log's schema as its owners do; (seconds, files before, after)."""
    con = connect_lake(lake, read_only=False)
    try:
        schema = schema_name(log)
        files = "SELECT count(*) FROM ducklake_list_files('lake', ?, schema => ?)"
        tables = [
            str(t)
            for (t,) in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' "
                "AND schema_name = ?",
                [schema],
            ).fetchall()
        ]

        def count() -> int:
            total = 0
            for table in tables:
                row = con.execute(files, [table, schema]).fetchone()
                total += int(row[0]) if row else 0
            return total

        before = count()
        began = time.perf_counter()
        for table in tables:
            con.execute(
                "CALL ducklake_merge_adjacent_files('lake', ?, schema => ?)", [table, schema]
            )
            con.execute("CALL ducklake_rewrite_data_files('lake', ?, schema => ?)", [table, schema])
        took = time.perf_counter() - began
        return took, before, count()
    finally:
        con.close()


def _extensions_missing() -> bool:
    """True, saying why, where the [lake] extra's DuckDB and extensions are not installed."""
    try:
        extension_directory()
    except ConfigError as exc:
        print(f"[lake] skipped: {exc.message}", flush=True)
        return True
    return False


@contextlib.contextmanager
def _stack() -> Iterator[LakeStack]:
    """PostgreSQL and moto on loopback, their settings in this process's environment."""
    with lake_stack() as stack:
        os.environ.update(stack.env())
        yield stack


def run(quick: bool = False, bootstrap: str | None = None, n: int | None = None) -> list[Row]:
    """Measure the lake against the file on 1M events (10k quick)."""
    if _extensions_missing():
        return []
    n = n or (10_000 if quick else 1_000_000)
    gc.collect()
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp, _stack() as stack:
        settings = fresh_settings(servers, partitions=PARTITIONS)
        produce_bulk(settings, workload(n))
        file_reports: list[BatchReport] = []
        file_rate, *_ = projector_rate(settings, Path(tmp) / "p.duckdb", n, reports=file_reports)
        lake = stack.new_lake()
        options = replace(ProjectorOptions(), group="bench-lake", lake=lake)
        lake_reports: list[BatchReport] = []
        lake_rate, *_ = projector_rate(settings, Path(tmp) / "x", n, options, lake_reports)
        analyst = analyst_rows(lake, settings.topic)
    ms = 1000.0
    lake_s = [r.seconds for r in lake_reports]
    file_s = [r.seconds for r in file_reports]
    size = f"{n:,} events, {PARTITIONS} partitions"
    return [
        Row(
            "lake",
            f"events/s into the lake ({size}) vs into a file",
            lake_rate,
            file_rate,
            "events/s",
        ),
        Row(
            "lake",
            "batch prepared to committed, p50 (vs the file's)",
            percentile(lake_s, 50) * ms,
            percentile(file_s, 50) * ms,
            "ms",
            "",
            False,
        ),
        Row(
            "lake",
            "batch prepared to committed, p95 (vs the file's)",
            percentile(lake_s, 95) * ms,
            percentile(file_s, 95) * ms,
            "ms",
            "",
            False,
        ),
        *analyst,
    ]


def run_grouping(
    bootstrap: str | None = None, *, partitions: int = 64, rows: int = 256_000, size: int = 2_000
) -> list[Row]:
    """One table per partition vs per group of partitions vs one table (``--grouping``)."""
    from bench import lake_grouping

    if _extensions_missing():
        return []
    with _stack() as stack:
        layouts = [
            lake_grouping.measure(stack.new_lake(), layout, partitions, rows, size)
            for layout in lake_grouping.LAYOUTS
        ]
    return lake_grouping.rows_of(layouts, partitions, rows)


def run_query_only(n: int | None = None, budget_s: float | None = None) -> list[Row]:
    """An analyst's queries on a lake of n events (10M) filled without Kafka (``--query-only``)."""
    from bench import lake_query

    if _extensions_missing():
        return []
    with _stack() as stack:
        return lake_query.measure(n or 10_000_000, PARTITIONS, stack.new_lake(), budget_s=budget_s)


def main() -> None:
    """``python -m bench.lake [--quick] [--events N] [--grouping] [--query-only]``."""
    import argparse

    from bench.common import ENGINES, run_broker, table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--bootstrap", help="use this broker instead of a local one")
    parser.add_argument("--engine", choices=ENGINES, default="tansu", help="the local broker")
    parser.add_argument("--events", type=int, help="events projected (default 1M, 10k quick)")
    parser.add_argument(
        "--grouping",
        action="store_true",
        help="measure the table grouping instead (a table per partition, per group, one)",
    )
    parser.add_argument("--partitions", type=int, default=64, help="with --grouping")
    parser.add_argument("--rows", type=int, default=256_000, help="with --grouping")
    parser.add_argument(
        "--query-only",
        action="store_true",
        help="fill the lake by the projector in-process, no Kafka (default 10M events), then "
        "time the analyst's queries and the compaction",
    )
    parser.add_argument(
        "--budget", type=float, help="with --query-only: stop filling after this many seconds"
    )
    args = parser.parse_args()
    if args.grouping:
        print(table(run_grouping(partitions=args.partitions, rows=args.rows)))
        return
    if args.query_only:
        print(table(run_query_only(args.events, args.budget)))
        return
    with run_broker(args.engine, args.bootstrap) as bootstrap:
        print(table(run(quick=args.quick, bootstrap=bootstrap, n=args.events)))


if __name__ == "__main__":
    main()

"""Read-only SQL over a published snapshot, and a workflow's steps for ``status``.

Three locks keep a query from changing anything: only SELECT/EXPLAIN statements pass the
check, the file is opened read-only, and file access (COPY TO, ATTACH, INSTALL, reading
arbitrary files) is disabled with the configuration locked.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import duckdb

from stepledger.errors import ReadOnlyQueryError, ViewStoreError
from stepledger.readers.lake import LakeSource, connect_lake_reader
from stepledger.readers.snapshots import connect_projection

#: What a query reads: a snapshot file, a shard directory, or the lake's tables of one log.
Source = str | Path | LakeSource

OutputFormat = Literal["table", "csv", "json"]

#: How long one ``query`` may run by default: a cron alert must not hang on a runaway query.
DEFAULT_TIMEOUT_S = 300.0

_READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


@dataclass(frozen=True)
class QueryResult:
    """Column names and rows of one statement."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def check_read_only(sql: str) -> list[duckdb.Statement]:
    """Parse the SQL and refuse anything but SELECT and EXPLAIN statements."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ViewStoreError(f"invalid SQL: {_first_line(exc)}") from exc
    if not statements:
        raise ViewStoreError("no SQL statement given")
    for statement in statements:
        if statement.type not in _READ_STATEMENTS:
            kind = str(statement.type).rsplit(".", 1)[-1]
            raise ReadOnlyQueryError(
                f"refused: {kind} statements are not allowed; queries are read-only "
                "(SELECT and EXPLAIN only)"
            )
    return statements


def _connect(source: Source) -> duckdb.DuckDBPyConnection:
    if isinstance(source, LakeSource):
        return connect_lake_reader(source.config, source.log)
    return connect_projection(source)


def run_query(
    path: Source, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S
) -> list[QueryResult]:
    """Run read-only SQL against a projection file, shard directory or lake; each result.

    Past ``timeout`` seconds (all statements together; None: no limit) the query is
    interrupted and a ViewStoreError says so; Ctrl-C interrupts it at once the same way.
    """
    statements = check_read_only(sql)
    con = _connect(path)
    worker = _QueryWorker(con, [statement.query for statement in statements])
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = interrupted = False
    try:
        try:
            worker.start()
            while not worker.left.wait(0.05):
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
        except KeyboardInterrupt:
            interrupted = True
        if timed_out or interrupted:
            _stop(worker)
        if interrupted or not worker.left.is_set():
            raise ViewStoreError(f"the query {_why(timeout, timed_out)}")
        if worker.error is None:
            return worker.results
        raise worker.error
    except duckdb.InterruptException as exc:
        raise ViewStoreError(f"the query {_why(timeout, timed_out)}") from exc
    except RuntimeError as exc:
        # DuckDB turns an interrupt during a statement into RuntimeError("Query interrupted").
        if "interrupt" not in str(exc).lower():
            raise
        raise ViewStoreError(f"the query {_why(timeout, timed_out)}") from exc
    except duckdb.PermissionException as exc:
        raise ReadOnlyQueryError(f"refused: {_first_line(exc)}") from exc
    except duckdb.Error as exc:
        raise ViewStoreError(f"query failed: {_first_line(exc)}") from exc
    finally:
        if worker.left.is_set():
            con.close()
        else:
            _keep_until_exit(worker)


def _why(timeout: float | None, timed_out: bool) -> str:
    return f"ran longer than {timeout:g}s (--timeout)" if timed_out else "was interrupted"


class _QueryWorker(threading.Thread):
    """Runs the statements so that the main thread stays in Python and takes Ctrl-C at once.

    ``left`` is set once the thread is out of DuckDB for good. The caller waits on it and
    never on ``join``: on Python 3.11 a Ctrl-C that lands in ``Thread.join(timeout)`` marks
    the thread as stopped while it still runs (CPython issue 90882), so the caller would
    close the connection and the interpreter would exit while the statement is still inside
    DuckDB; finalizing kills the thread as it retakes the GIL there, and the C++ unwinding
    aborts the process (``terminate called``, SIGABRT).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, queries: list[str]) -> None:
        super().__init__(name="stepledger-query", daemon=True)
        self.con = con
        self.queries = queries
        self.left = threading.Event()
        self.stopping = threading.Event()
        self.results: list[QueryResult] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for query in self.queries:
                if self.stopping.is_set():
                    raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
                cursor = self.con.execute(query)
                columns = [d[0] for d in cursor.description or []]
                self.results.append(QueryResult(columns, cursor.fetchall()))
        except BaseException as exc:  # handed to the caller's thread
            self.error = exc
        finally:
            self.left.set()


#: How long an interrupted statement may take to leave DuckDB before the query gives it up.
INTERRUPT_GRACE_S = 10.0


def _stop(worker: _QueryWorker) -> None:
    """Interrupt the worker's statement and wait, bounded, until it has left DuckDB.

    The interrupt is repeated while waiting: DuckDB forgets one that comes before a
    statement starts, and a further Ctrl-C only interrupts again.
    """
    worker.stopping.set()
    give_up = time.monotonic() + INTERRUPT_GRACE_S
    while not worker.left.is_set() and time.monotonic() < give_up:
        try:
            worker.con.interrupt()
            worker.left.wait(0.05)
        except KeyboardInterrupt:
            continue


_still_busy: list[_QueryWorker] = []


def _keep_until_exit(worker: _QueryWorker) -> None:
    """Keep a worker DuckDB did not let go of, with its open connection, until the process ends.

    The connection is not closed (DuckDB refuses to close one in use), and the process must
    not finalize while the worker is inside DuckDB (the abort above): if it is still there
    at exit, the process ends at once with status 1 after flushing its output.
    """
    if not _still_busy:
        atexit.register(_exit_if_still_busy)
    _still_busy[:] = [*(w for w in _still_busy if not w.left.is_set()), worker]


def _exit_if_still_busy() -> None:
    if any(not worker.left.is_set() for worker in _still_busy):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)


def plain(value: Any) -> Any:
    """A JSON/CSV-friendly form of a DuckDB value."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def to_records(result: QueryResult) -> list[dict[str, Any]]:
    """The rows as a list of column -> value objects."""
    return [
        {col: plain(v) for col, v in zip(result.columns, row, strict=True)} for row in result.rows
    ]


def to_csv(result: QueryResult) -> str:
    """The result as CSV with a header line."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([plain(v) for v in row] for row in result.rows)
    return buffer.getvalue()


def to_json(result: QueryResult) -> str:
    """The result as a JSON array of objects."""
    return json.dumps(to_records(result), ensure_ascii=False)


@dataclass(frozen=True)
class WorkflowView:
    """A workflow's row and its steps in order, as projected."""

    workflow: dict[str, Any]
    steps: list[dict[str, Any]]


_STEP_FIELDS = (
    "sequence, step_id, status, in_doubt, tool, effect, policy, attempt, recovery_attempts, "
    "idempotency_key, result_json, error, resolved_by, escalation_id, first_at, resolved_at, "
    "duration_ms"
)


def workflow_status(path: Source, workflow_id: str) -> WorkflowView:
    """A workflow's projected state; a ViewStoreError if the projection does not know it."""
    con = _connect(path)
    try:
        cursor = con.execute("SELECT * FROM workflows WHERE workflow_id = ?", [workflow_id])
        columns = [d[0] for d in cursor.description or []]
        row = cursor.fetchone()
        if row is None:
            raise ViewStoreError(
                f"workflow {workflow_id!r} is not in the projection at {path}",
                workflow_id=workflow_id,
            )
        # Same order as WorkflowState.ordered_steps: sequence, then first seen, then id.
        cursor = con.execute(
            f"SELECT {_STEP_FIELDS} FROM steps WHERE workflow_id = ? "
            "ORDER BY sequence, first_at, step_id",
            [workflow_id],
        )
        step_columns = [d[0] for d in cursor.description or []]
        steps = to_records(QueryResult(step_columns, cursor.fetchall()))
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot read {path}: {_first_line(exc)}") from exc
    finally:
        con.close()
    return WorkflowView(to_records(QueryResult(columns, [row]))[0], steps)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""Read-only SQL over a published snapshot, and a workflow's steps for ``status``.

Three locks keep a query from changing anything: only SELECT/EXPLAIN statements pass the
check, the file is opened read-only, and file access (COPY TO, ATTACH, INSTALL, reading
arbitrary files) is disabled with the configuration locked.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import duckdb

from stepledger.errors import ReadOnlyQueryError, ViewStoreError
from stepledger.snapshots import connect_projection

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


def run_query(
    path: str | Path, sql: str, *, timeout: float | None = DEFAULT_TIMEOUT_S
) -> list[QueryResult]:
    """Run read-only SQL against a projection file (or shard directory); each statement's result.

    Past ``timeout`` seconds (all statements together; None: no limit) the query is
    interrupted and a ViewStoreError says so.
    """
    statements = check_read_only(sql)
    con = connect_projection(path)
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            results = []
            for statement in statements:
                cursor = con.execute(statement.query)
                columns = [d[0] for d in cursor.description or []]
                results.append(QueryResult(columns, cursor.fetchall()))
            done["results"] = results
        except BaseException as exc:  # handed to the caller's thread below
            done["error"] = exc

    # The statements run in a worker so that this (main) thread stays in Python and takes
    # Ctrl-C at once, whatever DuckDB is doing; the timeout interrupts from here too.
    worker = threading.Thread(target=work, name="stepledger-query", daemon=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    try:
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.05)
                if deadline is not None and not timed_out and time.monotonic() > deadline:
                    timed_out = True
                    con.interrupt()
        except KeyboardInterrupt:
            con.interrupt()
            worker.join(10)
            raise ViewStoreError("the query was interrupted") from None
        if "error" not in done:
            return list(done["results"])
        raise done["error"]
    except duckdb.InterruptException as exc:
        why = f"ran longer than {timeout:g}s (--timeout)" if timed_out else "was interrupted"
        raise ViewStoreError(f"the query {why}") from exc
    except RuntimeError as exc:
        # DuckDB turns an interrupt during a statement into RuntimeError("Query interrupted").
        if "interrupt" not in str(exc).lower():
            raise
        why = f"ran longer than {timeout:g}s (--timeout)" if timed_out else "was interrupted"
        raise ViewStoreError(f"the query {why}") from exc
    except duckdb.PermissionException as exc:
        raise ReadOnlyQueryError(f"refused: {_first_line(exc)}") from exc
    except duckdb.Error as exc:
        raise ViewStoreError(f"query failed: {_first_line(exc)}") from exc
    finally:
        # Still busy with an interrupted statement: the process lets it go.
        with contextlib.suppress(duckdb.Error):
            con.close()


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


def workflow_status(path: str | Path, workflow_id: str) -> WorkflowView:
    """A workflow's projected state; a ViewStoreError if the projection does not know it."""
    con = connect_projection(path)
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

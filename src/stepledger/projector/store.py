"""The DuckDB side of the projector: one writer, bulk Arrow staging, one transaction per batch.

Rows of a batch and the ``(topic, partition, next_offset)`` they reach are committed in
the same transaction, so a crash anywhere leaves the tables and the offsets agreeing.
Upserts go through ``INSERT OR REPLACE`` with rows that are already one per key (DuckDB
keeps the first of duplicate keys in one statement).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from stepledger.errors import ViewStoreError
from stepledger.projector.rows import Columns
from stepledger.projector.schema import ARROW, KEYS, TABLES, create_schema

logger = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]

#: Checkpoints happen when a snapshot is published; DuckDB's default (16 MB of WAL) made
#: ingestion checkpoint every few batches, which cost more than the inserts themselves.
CHECKPOINT_THRESHOLD = "1GB"


#: DuckDB's own default is 80% of the machine's memory: too much for a daemon that shares it.
DEFAULT_MEMORY_LIMIT = "1GB"


class ProjectionStore:
    """The projector's DuckDB file, opened read-write by this process alone, for its whole life.

    DuckDB holds a POSIX (fcntl) lock on the file, and POSIX drops every lock a process holds
    on a file when the process closes *any* descriptor of it.  So the store opens one extra
    read-only descriptor now, copies snapshots through it, and closes it only after DuckDB:
    nothing in this process opens and closes the live file in between.
    """

    def __init__(self, path: str | Path, *, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        self.path = Path(path)
        try:
            self.con = duckdb.connect(str(self.path), config={"memory_limit": memory_limit})
            self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
            create_schema(self.con)
            # Reads of committed rows while a writer thread commits the previous batch.
            self._reader = self.con.cursor()
        except duckdb.Error as exc:
            raise ViewStoreError(f"cannot open projection {self.path}: {_short(exc)}") from exc
        self._fd = os.open(self.path, os.O_RDONLY)

    def copy_file(self, destination: Path) -> None:
        """Copy the database file (checkpointed by the caller) through the kept descriptor."""
        size = os.fstat(self._fd).st_size
        with open(destination, "wb") as out:
            done = 0
            while done < size:
                sent = os.sendfile(out.fileno(), self._fd, done, size - done)
                if sent == 0:
                    break
                done += sent

    def offsets(self) -> Offsets:
        """The next offset to read per (topic, partition), as committed with the rows."""
        rows = self._query("SELECT topic, partition, next_offset FROM offsets", [])
        return {(str(t), int(p)): int(o) for t, p, o in rows}

    def last_event(self, topic: str, partition: int, below: int) -> tuple[int, bytes] | None:
        """The offset and value of the last event projected from a partition below an offset."""
        sql = (
            "SELECT log_offset, value FROM events WHERE topic = ? AND partition = ? "
            "AND log_offset < ? ORDER BY log_offset DESC LIMIT 1"
        )
        rows = self._query(sql, [topic, partition, below])
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def known_workflows(self, workflow_ids: list[str]) -> set[str]:
        """The subset of these workflows that has rows in the projection."""
        if not workflow_ids:
            return set()
        sql = "SELECT workflow_id FROM workflows WHERE workflow_id IN (SELECT unnest(?))"
        return {str(row[0]) for row in self._query(sql, [workflow_ids], self._reader)}

    def history(self, workflow_ids: list[str]) -> list[tuple[str, bytes]]:
        """Stored (workflow id, value) of these workflows' events, in log order."""
        if not workflow_ids:
            return []
        sql = (
            "SELECT workflow_id, value FROM events WHERE workflow_id IN (SELECT unnest(?)) "
            "ORDER BY topic, partition, log_offset"
        )
        return [(str(w), bytes(v)) for w, v in self._query(sql, [workflow_ids], self._reader)]

    def write(self, staged: Mapping[str, pa.Table], replaced_workflows: list[str]) -> None:
        """Write one batch's staged rows (offsets included) in a single transaction."""
        try:
            self.con.execute("BEGIN TRANSACTION")
            if replaced_workflows:
                self.con.execute(
                    "DELETE FROM steps WHERE workflow_id IN (SELECT unnest(?))",
                    [replaced_workflows],
                )
            for name in TABLES:
                if name in staged:
                    self._insert(name, staged[name])
            self.con.execute("COMMIT")
        except duckdb.Error as exc:
            self._rollback()
            raise ViewStoreError(f"projection write failed: {_short(exc)}") from exc

    def _insert(self, table: str, rows: pa.Table) -> None:
        view = f"_stage_{table}"
        self.con.register(view, rows)
        try:
            verb = "INSERT OR REPLACE" if table in KEYS else "INSERT"
            self.con.execute(f"{verb} INTO {table} SELECT * FROM {view}")
        finally:
            self.con.unregister(view)

    def _rollback(self) -> None:
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            logger.debug("rollback after a failed write failed too", exc_info=True)

    def checkpoint(self) -> None:
        """Flush the WAL into the database file (so a copy of the file is complete)."""
        try:
            self.con.execute("CHECKPOINT")
        except duckdb.Error as exc:
            raise ViewStoreError(f"checkpoint failed: {_short(exc)}") from exc

    def count(self, table: str) -> int:
        """Number of rows in a projected table."""
        if table not in TABLES:
            raise ViewStoreError(f"unknown table {table!r}")
        return int(self._query(f"SELECT count(*) FROM {table}", [])[0][0])

    def close(self) -> None:
        """Checkpoint and close the file."""
        try:
            self.con.execute("CHECKPOINT")
        except duckdb.Error:
            logger.warning("final checkpoint failed", exc_info=True)
        self._reader.close()
        self.con.close()
        os.close(self._fd)

    def _query(
        self, sql: str, params: list[Any], con: duckdb.DuckDBPyConnection | None = None
    ) -> list[tuple[Any, ...]]:
        try:
            return (con or self.con).execute(sql, params).fetchall()
        except duckdb.Error as exc:
            raise ViewStoreError(f"projection query failed: {_short(exc)}") from exc

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stage(tables: Mapping[str, Columns], offsets: Offsets) -> dict[str, pa.Table]:
    """A batch's rows and the offsets they reach as Arrow tables, ready for ``write``.

    Converting Python values holds the GIL, so the thread that built the rows does it and
    the writer thread only runs DuckDB, which does not.
    """
    staged = {name: _arrow(name, cols) for name, cols in tables.items() if _has_rows(cols)}
    if offsets:
        staged["offsets"] = _arrow("offsets", _offset_columns(offsets))
    return staged


def _has_rows(columns: Columns) -> bool:
    return bool(columns) and bool(next(iter(columns.values())))


def _offset_columns(offsets: Offsets) -> Columns:
    return {
        "topic": [t for t, _ in offsets],
        "partition": [p for _, p in offsets],
        "next_offset": list(offsets.values()),
    }


def _arrow(table: str, columns: Columns) -> pa.Table:
    return pa.Table.from_pydict(columns, schema=ARROW[table])


def _short(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

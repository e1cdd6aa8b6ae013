"""The DuckDB side of the projector: one writer, bulk Arrow staging, one transaction per batch.

Rows of a batch and the ``(topic, partition, next_offset)`` they reach are committed in
the same transaction, so a crash anywhere leaves the tables and the offsets agreeing.
Upserts go through ``INSERT OR REPLACE`` with rows that are already one per key (DuckDB
keeps the first of duplicate keys in one statement).

Reads from other threads go through a second connection (a cursor) and never overlap a
``CHECKPOINT``: DuckDB refuses to checkpoint while another connection's transaction began
before a committed upsert ("Cannot CHECKPOINT: there are other write transactions
active", measured with DuckDB 2.0.1 even for a read-only ``SELECT``), and under load the
main thread's history loads overlapped the writer thread's snapshot checkpoint.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from stepledger.errors import ViewStoreError
from stepledger.projector.boundary import Offsets
from stepledger.projector.rows import Columns
from stepledger.projector.schema import ARROW, KEYS, TABLES, create_schema

logger = logging.getLogger(__name__)


#: Checkpoints happen when a snapshot is published; DuckDB's default (16 MB of WAL) made
#: ingestion checkpoint every few batches, which cost more than the inserts themselves.
CHECKPOINT_THRESHOLD = "1GB"


#: DuckDB's own default is 80% of the machine's memory: too much for a daemon that shares it.
DEFAULT_MEMORY_LIMIT = "1GB"


class _OpenFiles:
    """The projection files this process has open, so a second store of one file is refused.

    Inside one process DuckDB hands every connection to a file the same database, and the
    file's fcntl lock belongs to the process: neither keeps a second writer of this process
    away.  A file is known by its resolved path and, once it exists, its inode.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[object] = set()

    @contextmanager
    def claim(self, path: Path) -> Iterator[list[object]]:
        """Hold the registry while the file is opened; refuse one this process has open."""
        with self._lock:
            keys: list[object] = [str(path.resolve())]
            if any(key in self._keys for key in [*keys, *_inode(path)]):
                raise ViewStoreError(
                    f"cannot open projection {path}: it is already open in this process"
                )
            yield keys
            keys.extend(_inode(path))
            self._keys.update(keys)

    def release(self, keys: list[object]) -> None:
        """Forget a closed file."""
        with self._lock:
            self._keys.difference_update(keys)


def _inode(path: Path) -> list[object]:
    try:
        st = path.stat()
    except OSError:
        return []
    return [(st.st_dev, st.st_ino)]


#: Process-wide, like DuckDB's own cache of open databases that it mirrors.
_OPEN_FILES = _OpenFiles()


class ProjectionStore:
    """The projector's DuckDB file, opened read-write by this process alone, for its whole life.

    DuckDB holds a POSIX (fcntl) lock on the file, and POSIX drops every lock a process holds
    on a file when the process closes *any* descriptor of it.  So the store opens one extra
    read-only descriptor now, copies snapshots through it, and closes it only after DuckDB:
    nothing in this process opens and closes the live file in between.  A second store of a
    file this process has open is refused (ViewStoreError), as another process would be.
    """

    def __init__(self, path: str | Path, *, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        self.path = Path(path)
        # A read and a checkpoint never overlap (see the module docstring).
        self._reading = threading.Lock()
        with _OPEN_FILES.claim(self.path) as keys:
            self._open(memory_limit)
        self._keys = keys

    def _open(self, memory_limit: str) -> None:
        try:
            self.con = duckdb.connect(str(self.path), config={"memory_limit": memory_limit})
        except duckdb.Error as exc:
            raise ViewStoreError(f"cannot open projection {self.path}: {_short(exc)}") from exc
        try:
            self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
            create_schema(self.con)
            # Reads of committed rows while a writer thread commits the previous batch.
            self._reader = self.con.cursor()
            self._fd = os.open(self.path, os.O_RDONLY)
        except BaseException as exc:  # a refused schema too: nothing may stay open
            self.con.close()
            if isinstance(exc, duckdb.Error | OSError):
                raise ViewStoreError(f"cannot open projection {self.path}: {_short(exc)}") from exc
            raise

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

    def publish(self) -> str | None:
        """Publish a snapshot for readers (see :mod:`stepledger.projector.snapshot`)."""
        from stepledger.projector.snapshot import publish_snapshot  # it reads this store

        path = publish_snapshot(self)
        return None if path is None else str(path)

    def offsets(self) -> Offsets:
        """The next offset to read per (topic, partition), as committed with the rows."""
        rows = self._read("SELECT topic, partition, next_offset FROM offsets", [])
        return {(str(t), int(p)): int(o) for t, p, o in rows}

    def last_event(self, topic: str, partition: int, below: int) -> tuple[int, bytes] | None:
        """The offset and value of the last event projected from a partition below an offset."""
        sql = (
            "SELECT log_offset, value FROM events WHERE topic = ? AND partition = ? "
            "AND log_offset < ? ORDER BY log_offset DESC LIMIT 1"
        )
        rows = self._read(sql, [topic, partition, below])
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def known_workflows(self, workflow_ids: list[str]) -> set[str]:
        """The subset of these workflows that has rows in the projection."""
        if not workflow_ids:
            return set()
        sql = "SELECT workflow_id FROM workflows WHERE workflow_id IN (SELECT unnest(?))"
        return {str(row[0]) for row in self._read(sql, [workflow_ids])}

    def each_workflow_id(self, take: Callable[[list[str]], None], chunk: int = 100_000) -> None:
        """Hand every projected workflow's id to ``take``, a chunk at a time."""
        with self._reading:
            try:
                result = self._reader.execute("SELECT workflow_id FROM workflows")
                while rows := result.fetchmany(chunk):
                    take([str(row[0]) for row in rows])
            except duckdb.Error as exc:
                raise ViewStoreError(f"projection query failed: {_short(exc)}") from exc

    def history(self, workflow_ids: list[str]) -> list[tuple[str, bytes]]:
        """Stored (workflow id, value) of these workflows' events, in log order."""
        if not workflow_ids:
            return []
        sql = (
            "SELECT workflow_id, value FROM events WHERE workflow_id IN (SELECT unnest(?)) "
            "ORDER BY topic, partition, log_offset"
        )
        return [(str(w), bytes(v)) for w, v in self._read(sql, [workflow_ids])]

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

    def checkpoint(self) -> bool:
        """Flush the WAL into the database file (so a copy of the file is complete).

        Returns False, having changed nothing, when a transaction of another connection to
        this database holds the checkpoint back (none of the store's own reads can).
        """
        with self._reading:
            try:
                self.con.execute("CHECKPOINT")
            except duckdb.TransactionException as exc:
                logger.warning("checkpoint of %s held back: %s", self.path, _short(exc))
                return False
            except duckdb.Error as exc:
                raise ViewStoreError(f"checkpoint failed: {_short(exc)}") from exc
        return True

    def count(self, table: str) -> int:
        """Number of rows in a projected table."""
        if table not in TABLES:
            raise ViewStoreError(f"unknown table {table!r}")
        return int(self._read(f"SELECT count(*) FROM {table}", [])[0][0])

    def close(self) -> None:
        """Checkpoint and close the file."""
        try:
            self.checkpoint()
        except ViewStoreError:
            logger.warning("final checkpoint failed", exc_info=True)
        try:
            self._reader.close()
            self.con.close()
        finally:
            os.close(self._fd)
            _OPEN_FILES.release(self._keys)

    def _read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Committed rows, read through the reader and wholly fetched (which ends its
        transaction) before a checkpoint may start."""
        with self._reading:
            try:
                return self._reader.execute(sql, params).fetchall()
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

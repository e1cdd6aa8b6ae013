"""The projector's store in a DuckLake: one partition's tables, its offset guarded.

A :class:`LakeStore` is one partition's table set (``events__p0007``, ``steps__p0007``, ...,
``offsets__p0007``) in the step log's schema of the lake (:mod:`stepledger.readers.lake`).
A batch is one DuckLake transaction, as in a file: its rows, then its partition's offset,
updated only ``WHERE next_offset = <where the batch started>``.  That guard is the fence a
file's lock is in the shard mode: a projector that lost its partition while paused (a
zombie) finds the offset moved by the new owner, updates no row, and commits nothing;
DuckLake's own conflict check refuses a commit that raced the new owner's on one table.

Commits that fail for want of the catalog or the bucket (PostgreSQL restarting, the bucket
unreachable) are tried again, the same rows under the same guard, until ``outage_s`` has
passed: the lake's offset then tells whether an unanswered commit landed (it reached the
batch's end), is still to do (it is where the batch started), or lost the partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from stepledger.errors import ViewStoreError
from stepledger.projector.boundary import Offsets
from stepledger.projector.schema import ARROW, KEYS, TABLES, columns_sql, view_sql
from stepledger.readers.lake import (
    ALIAS,
    LakeConfig,
    connect_lake,
    first_line,
    schema_name,
    table_name,
)

logger = logging.getLogger(__name__)

#: How long a commit keeps trying through an unreachable catalog or bucket.
DEFAULT_OUTAGE_S = 600.0
#: The first wait between two tries of a failed commit; it doubles up to ``_RETRY_MAX_S``.
_RETRY_FIRST_S = 0.2
_RETRY_MAX_S = 5.0
#: Commits refused by DuckLake's conflict check (another writer of the table) in a row
#: before the store stops trying: a table set is one writer's, so a conflict is rare.
_CONFLICTS = 20
#: How often the owner compacts its tables (small files made by every batch).
DEFAULT_COMPACT_EVERY_S = 60.0
#: How often a projector expires the lake's old snapshots and deletes the files no snapshot
#: needs any more (lake-wide: whichever projector is due does it; a race loses harmlessly).
DEFAULT_EXPIRE_EVERY_S = 3600.0
#: How long an expired snapshot stays readable (a reader's query that began before it).
DEFAULT_KEEP_SNAPSHOTS_S = 3600.0
#: What a failure of the catalog's or the bucket's connection looks like.
_OUTAGE = (duckdb.IOException, duckdb.HTTPException, duckdb.ConnectionException)
_OUTAGE_SIGNS = ("connection", "could not connect", "timeout", "timed out", "server closed")


class LakeFencedError(ViewStoreError):
    """The partition's offset in the lake moved under this writer: another owner has it."""


class LakeDatabase:
    """One process's attachment of the lake: table sets created, views kept current."""

    def __init__(
        self,
        config: LakeConfig,
        log: str,
        *,
        outage_s: float = DEFAULT_OUTAGE_S,
        compact_every_s: float = DEFAULT_COMPACT_EVERY_S,
        expire_every_s: float = DEFAULT_EXPIRE_EVERY_S,
        keep_snapshots_s: float = DEFAULT_KEEP_SNAPSHOTS_S,
    ) -> None:
        self.config = config
        self.log = log
        self.schema = schema_name(log)
        self.outage_s = outage_s
        self.compact_every_s = compact_every_s
        self.expire_every_s = expire_every_s
        self.keep_snapshots_s = keep_snapshots_s
        self.con = connect_lake(config, read_only=False)
        self._lock = threading.Lock()
        self._expired = time.monotonic()

    def qualified(self, name: str) -> str:
        """A table or view of the log's schema, as SQL."""
        return f'{ALIAS}.{self.schema}."{name}"'

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own (one transaction at a time) to the same lake."""
        with self._lock:
            return self.con.cursor()

    def ensure(self, topic: str, partition: int) -> bool:
        """Create the partition's tables (with an offset row at 0) and the views over them;
        whether this call created its table set (no projector had opened it before)."""
        names = {t: table_name(t, self.log, topic, partition) for t in TABLES}
        con = self.cursor()
        created: list[bool] = []
        try:
            retrying(
                lambda: created.append(self._create(con, topic, partition, names)),
                self.outage_s,
                "create",
            )
        finally:
            con.close()
        return bool(created and created[-1])

    def _create(
        self, con: duckdb.DuckDBPyConnection, topic: str, partition: int, names: dict[str, str]
    ) -> bool:
        present = _columns(con, self.schema)
        missing = [t for t, name in names.items() if name not in present]
        # Columns a newer stepledger projects (its schema grew), added to existing tables.
        added = [
            (name, definition)
            for table, name in names.items()
            if name in present
            for column, definition in zip(ARROW[table].names, columns_sql(table), strict=True)
            if column not in present[name]
        ]
        if not missing and not added:
            return False
        # One transaction: a reader finds the schema with its views, or no schema at all.
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {ALIAS}.{self.schema}")
            for table in missing:
                columns = ", ".join(columns_sql(table))
                con.execute(f"CREATE TABLE {self.qualified(names[table])} ({columns})")
            for name, definition in added:
                con.execute(f"ALTER TABLE {self.qualified(name)} ADD COLUMN {definition}")
            if "offsets" in missing:
                con.execute(
                    f"INSERT INTO {self.qualified(names['offsets'])} VALUES (?, ?, 0)",
                    [topic, partition],
                )
            self._views(con, set(names.values()))
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise
        return "offsets" in missing

    def _views(self, con: duckdb.DuckDBPyConnection, new: set[str]) -> None:
        """Each projected table as the UNION ALL of its partitions' tables, then the views."""
        present = _tables(con, self.schema) | new
        for table in TABLES:
            parts = sorted(n for n in present if n.startswith(f"{table}__"))
            # By name: a partition whose owner has not added a newer column yet reads NULL.
            union = " UNION ALL BY NAME ".join(f"SELECT * FROM {self.qualified(n)}" for n in parts)
            con.execute(f"CREATE OR REPLACE VIEW {self.qualified(table)} AS {union}")
        for view, sql in view_sql().items():
            con.execute(f"CREATE OR REPLACE VIEW {self.qualified(view)} AS {sql}")

    def expire(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Expire old snapshots and delete unneeded files when due; whether it ran."""
        with self._lock:
            now = time.monotonic()
            if now - self._expired < self.expire_every_s:
                return False
            self._expired = now
        older = f"now() - INTERVAL {int(self.keep_snapshots_s)} SECOND"
        try:
            con.execute(f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => {older})")
            con.execute(f"CALL ducklake_cleanup_old_files('{ALIAS}', older_than => {older})")
        except duckdb.Error as exc:
            logger.warning("lake snapshot expiry skipped: %s", first_line(exc))
            return False
        return True

    def close(self) -> None:
        """Detach the lake."""
        with self._lock:
            self.con.close()


def lake_tables(db: LakeDatabase) -> set[str]:
    """The tables the lake holds in the log's schema (none: a fresh lake for this log)."""
    con = db.cursor()
    try:
        return _tables(con, db.schema)
    finally:
        con.close()


def _columns(con: duckdb.DuckDBPyConnection, schema: str) -> dict[str, set[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE database_name = ? AND schema_name = ?",
        [ALIAS, schema],
    ).fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(str(table), set()).add(str(column))
    return found


def _tables(con: duckdb.DuckDBPyConnection, schema: str) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = ?",
        [ALIAS, schema],
    ).fetchall()
    return {str(name) for (name,) in rows}


class LakeStore:
    """One partition's projection in the lake, written by the partition's owner."""

    def __init__(self, db: LakeDatabase, topic: str, partition: int) -> None:
        self.db = db
        self.where = (topic, partition)
        self.created = db.ensure(topic, partition)
        """Whether this store created the partition's table set (its first owner ever)."""
        self.names = {t: db.qualified(table_name(t, db.log, topic, partition)) for t in TABLES}
        self.path = f"{ALIAS}.{db.schema} {topic}[{partition}]"
        """What the store is, for messages."""
        self._writer = db.cursor()
        self._reader = db.cursor()
        self._reading = threading.Lock()
        self._next = 0
        """The partition's next offset as this writer last saw it in the lake (the guard)."""
        self._compacted = time.monotonic()
        self.fenced: str | None = None
        """Why a commit was refused because another projector owns the partition now."""

    def offsets(self) -> Offsets:
        """The partition's next offset (nothing while it is 0: no record projected yet)."""
        self._next = self._lake_offset()
        return {self.where: self._next} if self._next else {}

    def _lake_offset(self) -> int:
        rows = self._read(f"SELECT max(next_offset) FROM {self.names['offsets']}", [])
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def write(self, staged: Mapping[str, pa.Table], replaced_workflows: list[str]) -> None:
        """Commit the batch's rows and the partition's offset in one guarded transaction."""
        reached = self._reached(staged)
        start = self._next
        conflicts = 0
        began = time.monotonic()
        wait = _RETRY_FIRST_S
        while True:
            try:
                self._commit(staged, replaced_workflows, start, reached)
                break
            except LakeFencedError as exc:
                self.fenced = exc.message
                raise
            except duckdb.TransactionException as exc:
                conflicts += 1
                if conflicts >= _CONFLICTS:
                    raise ViewStoreError(f"lake commit of {self.path}: {first_line(exc)}") from exc
            except duckdb.Error as exc:
                if not _outage(exc) or time.monotonic() - began > self.db.outage_s:
                    raise ViewStoreError(f"lake commit of {self.path}: {first_line(exc)}") from exc
                logger.warning(
                    "lake commit of %s failed (%s): trying again in %.1fs",
                    self.path,
                    first_line(exc),
                    wait,
                )
                time.sleep(wait)
                wait = min(_RETRY_MAX_S, wait * 2)
            if reached is not None and self._landed(start, reached, began):
                break
        if reached is not None:
            self._next = reached

    def _reached(self, staged: Mapping[str, pa.Table]) -> int | None:
        if "offsets" not in staged:
            return None
        rows = staged["offsets"].to_pylist()
        if [(r["topic"], r["partition"]) for r in rows] != [self.where]:
            raise ViewStoreError(f"a batch for {self.path} holds offsets of other partitions")
        return int(rows[0]["next_offset"])

    def _landed(self, start: int, reached: int, began: float) -> bool:
        """After a failed try: whether it landed after all (its answer was lost)."""
        while True:
            try:
                now = self._lake_offset()
                break
            except ViewStoreError:
                if time.monotonic() - began > self.db.outage_s:
                    raise
                time.sleep(_RETRY_MAX_S)
        if now == reached:
            return True
        if now != start:
            self.fenced = f"{self.path}: the lake's offset moved to {now}"
            raise LakeFencedError(
                f"{self.path}: the lake's offset is {now}, not {start} where this batch "
                "started: another projector owns the partition now; nothing was committed"
            )
        return False

    def _commit(
        self,
        staged: Mapping[str, pa.Table],
        replaced: list[str],
        start: int,
        reached: int | None,
    ) -> None:
        con = self._writer
        con.execute("BEGIN TRANSACTION")
        try:
            if replaced:
                con.execute(
                    f"DELETE FROM {self.names['steps']} WHERE workflow_id IN (SELECT unnest(?))",
                    [replaced],
                )
            for table in TABLES:
                if table in staged and table != "offsets":
                    self._insert(con, table, staged[table])
            if reached is not None:
                moved = con.execute(
                    f"UPDATE {self.names['offsets']} SET next_offset = ? WHERE next_offset = ?",
                    [reached, start],
                ).fetchone()
                if not moved or int(moved[0]) != 1:
                    raise LakeFencedError(
                        f"{self.path}: the lake's offset is no longer {start}, where this "
                        "batch started: another projector owns the partition now; nothing "
                        "was committed"
                    )
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise

    def _insert(self, con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> None:
        view = f"_stage_{table}"
        con.register(view, rows)
        try:
            target = self.names[table]
            if table in KEYS:
                # No primary keys in a lake: an upsert is a MERGE on the table's key (the
                # rows are one per key already, as for INSERT OR REPLACE in a file).
                on = " AND ".join(f't."{k}" = s."{k}"' for k in KEYS[table])
                con.execute(
                    f"MERGE INTO {target} AS t USING {view} AS s ON ({on}) "
                    "WHEN MATCHED THEN UPDATE WHEN NOT MATCHED THEN INSERT"
                )
            else:
                con.execute(f"INSERT INTO {target} SELECT * FROM {view}")
        finally:
            con.unregister(view)

    def publish(self) -> str | None:
        """Compact the partition's tables when due (in the writer, between batches)."""
        now = time.monotonic()
        if now - self._compacted < self.db.compact_every_s:
            return None
        self._compacted = now
        con = self._writer
        try:
            for name in self.names.values():
                table = name.rsplit(".", 1)[1].strip('"')
                args = [ALIAS, table, self.db.schema]
                con.execute("CALL ducklake_merge_adjacent_files(?, ?, schema => ?)", args)
                con.execute("CALL ducklake_rewrite_data_files(?, ?, schema => ?)", args)
        except duckdb.Error as exc:
            # A compaction that loses a race or an outage is tried again at the next one.
            logger.warning("compaction of %s skipped: %s", self.path, first_line(exc))
            return None
        self.db.expire(con)
        return f"compacted {self.path}"

    def count(self, table: str) -> int:
        """Number of the partition's rows in a projected table."""
        if table not in TABLES:
            raise ViewStoreError(f"unknown table {table!r}")
        return int(self._read(f"SELECT count(*) FROM {self.names[table]}", [])[0][0])

    def each_workflow_id(self, take: Callable[[list[str]], None], chunk: int = 100_000) -> None:
        """Hand every workflow id of the partition to ``take``, a chunk at a time."""
        rows = self._read(f"SELECT workflow_id FROM {self.names['workflows']}", [])
        for begin in range(0, len(rows), chunk):
            take([str(row[0]) for row in rows[begin : begin + chunk]])

    def known_workflows(self, workflow_ids: list[str]) -> set[str]:
        """The subset of these workflows that has rows in the partition's tables."""
        if not workflow_ids:
            return set()
        sql = (
            f"SELECT workflow_id FROM {self.names['workflows']} "
            "WHERE workflow_id IN (SELECT unnest(?))"
        )
        return {str(row[0]) for row in self._read(sql, [workflow_ids])}

    def history(self, workflow_ids: list[str]) -> list[tuple[str, bytes]]:
        """Stored (workflow id, value) of these workflows' events, in log order."""
        if not workflow_ids:
            return []
        sql = (
            f"SELECT workflow_id, value FROM {self.names['events']} "
            "WHERE workflow_id IN (SELECT unnest(?)) ORDER BY topic, partition, log_offset"
        )
        return [(str(w), bytes(v)) for w, v in self._read(sql, [workflow_ids])]

    def last_event(self, topic: str, partition: int, below: int) -> tuple[int, bytes] | None:
        """The offset and value of the partition's last event below an offset."""
        sql = (
            f"SELECT log_offset, value FROM {self.names['events']} WHERE topic = ? "
            "AND partition = ? AND log_offset < ? ORDER BY log_offset DESC LIMIT 1"
        )
        rows = self._read(sql, [topic, partition, below])
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def close(self) -> None:
        """Close this store's connections (the lake stays attached for the others)."""
        for con in (self._reader, self._writer):
            try:
                con.close()
            except duckdb.Error:
                logger.debug("closing a lake connection failed", exc_info=True)

    def _read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self._reading:
            try:
                return self._reader.execute(sql, params).fetchall()
            except duckdb.Error as exc:
                raise ViewStoreError(
                    f"lake query of {self.path} failed: {first_line(exc)}"
                ) from exc


def retrying(action: Callable[[], None], outage_s: float, what: str) -> None:
    """Run ``action``, again after a conflict or while the lake is unreachable (bounded)."""
    began = time.monotonic()
    wait = _RETRY_FIRST_S
    for _ in range(_CONFLICTS * 100):
        try:
            action()
            return
        except duckdb.TransactionException as exc:
            logger.info("lake %s conflicted (%s): trying again", what, first_line(exc))
        except duckdb.CatalogException as exc:
            # Another projector created the same table first: look again.
            if "already exists" not in str(exc):
                raise ViewStoreError(f"lake {what} failed: {first_line(exc)}") from exc
        except duckdb.Error as exc:
            if not _outage(exc) or time.monotonic() - began > outage_s:
                raise ViewStoreError(f"lake {what} failed: {first_line(exc)}") from exc
            logger.warning("lake %s failed (%s): trying again", what, first_line(exc))
        time.sleep(wait)
        wait = min(_RETRY_MAX_S, wait * 2)
    raise ViewStoreError(f"lake {what} failed: too many conflicts")


def _outage(exc: duckdb.Error) -> bool:
    if isinstance(exc, _OUTAGE):
        return True
    text = str(exc).lower()
    return any(sign in text for sign in _OUTAGE_SIGNS)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        logger.debug("rollback after a failed lake write failed too", exc_info=True)

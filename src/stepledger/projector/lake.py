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
from stepledger.projector.lake_db import (
    DEFAULT_COMPACT_EVERY_S,
    DEFAULT_EXPIRE_EVERY_S,
    DEFAULT_KEEP_SNAPSHOTS_S,
    DEFAULT_OUTAGE_S,
    MAX_CONFLICTS,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    LakeDatabase,
    is_outage,
    lake_tables,
    retrying,
    rollback,
)
from stepledger.projector.schema import KEYS, TABLES
from stepledger.readers.lake import ALIAS, first_line, table_name

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_COMPACT_EVERY_S",
    "DEFAULT_EXPIRE_EVERY_S",
    "DEFAULT_KEEP_SNAPSHOTS_S",
    "DEFAULT_OUTAGE_S",
    "LakeDatabase",
    "LakeFencedError",
    "LakeStore",
    "lake_tables",
    "retrying",
]


class LakeFencedError(ViewStoreError):
    """The partition's offset in the lake moved under this writer: another owner has it."""


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
        wait = RETRY_FIRST_S
        while True:
            try:
                self._commit(staged, replaced_workflows, start, reached)
                break
            except LakeFencedError as exc:
                self.fenced = exc.message
                raise
            except duckdb.TransactionException as exc:
                conflicts += 1
                if conflicts >= MAX_CONFLICTS:
                    raise ViewStoreError(f"lake commit of {self.path}: {first_line(exc)}") from exc
            except duckdb.Error as exc:
                if not is_outage(exc) or time.monotonic() - began > self.db.outage_s:
                    raise ViewStoreError(f"lake commit of {self.path}: {first_line(exc)}") from exc
                logger.warning(
                    "lake commit of %s failed (%s): trying again in %.1fs",
                    self.path,
                    first_line(exc),
                    wait,
                )
                time.sleep(wait)
                wait = min(RETRY_MAX_S, wait * 2)
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
                time.sleep(RETRY_MAX_S)
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
            rollback(con)
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

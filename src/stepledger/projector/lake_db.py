"""The lake as one process attaches it: table sets created, views kept, snapshots expired.

:class:`LakeDatabase` is what every :class:`~stepledger.projector.lake.LakeStore` of a
process shares: the attachment, the creation of a partition's table set (with its views,
in one transaction), the lake-wide snapshot expiry, and the bounded retry of a statement
through a conflict or an outage of the catalog or the bucket.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import duckdb

from stepledger.errors import ViewStoreError
from stepledger.projector.schema import ARROW, TABLES, columns_sql, view_sql
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
#: The first wait between two tries of a failed commit; it doubles up to ``RETRY_MAX_S``.
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
#: Commits refused by DuckLake's conflict check (another writer of the table) in a row
#: before the store stops trying: a table set is one writer's, so a conflict is rare.
MAX_CONFLICTS = 20
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
            rollback(con)
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


def retrying(action: Callable[[], None], outage_s: float, what: str) -> None:
    """Run ``action``, again after a conflict or while the lake is unreachable (bounded)."""
    began = time.monotonic()
    wait = RETRY_FIRST_S
    for _ in range(MAX_CONFLICTS * 100):
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
            if not is_outage(exc) or time.monotonic() - began > outage_s:
                raise ViewStoreError(f"lake {what} failed: {first_line(exc)}") from exc
            logger.warning("lake %s failed (%s): trying again", what, first_line(exc))
        time.sleep(wait)
        wait = min(RETRY_MAX_S, wait * 2)
    raise ViewStoreError(f"lake {what} failed: too many conflicts")


def is_outage(exc: duckdb.Error) -> bool:
    if isinstance(exc, _OUTAGE):
        return True
    text = str(exc).lower()
    return any(sign in text for sign in _OUTAGE_SIGNS)


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        logger.debug("rollback after a failed lake write failed too", exc_info=True)

"""The inbox's queue: open escalations and pending approvals, read from the projection.

Reads the projector's published read-only snapshot (``<db>.snapshot.duckdb``; the file
itself when no projector runs), never the topic: the ``escalations`` table's open rows
and the ``steps`` waiting for an approval, with filters, counts and one page at a time.
A new connection per read sees the newest snapshot; one read is one consistent cut.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb

from stepledger.domain import times
from stepledger.errors import ViewStoreError
from stepledger.readers.lake import LakeSource, connect_lake_reader, first_line, lake_version
from stepledger.readers.snapshots import connect_read_only, latest_snapshot, readable_source

PAGE_SIZE = 50
MAX_PAGE = 10_000

#: Every open case, one row each: an escalation (of a step or a workflow) or an approval.
_CASES = """
    SELECT 'escalation' AS kind, e.kind AS scope, e.escalation_id AS case_id,
           e.workflow_id, e.step_id, e.fleet_id, coalesce(s.tool, '') AS tool,
           e.reason, e.opened_at
    FROM escalations e
    LEFT JOIN steps s ON s.workflow_id = e.workflow_id AND s.step_id = e.step_id
    WHERE e.status = 'open'
    UNION ALL
    SELECT 'approval', 'step', NULL, workflow_id, step_id, fleet_id, tool,
           'approval requested', first_at
    FROM steps WHERE status = 'awaiting_approval'
"""


class Order(StrEnum):
    """Which cases come first."""

    NEWEST = "newest"
    OLDEST = "oldest"


class KindFilter(StrEnum):
    """Which kind of case to list."""

    ALL = ""
    ESCALATION = "escalation"
    APPROVAL = "approval"


def parse_age(text: str) -> timedelta | None:
    """``90``, ``90s``, ``15m``, ``2h`` or ``7d`` as a timedelta; empty is no filter."""
    if not text.strip():
        return None
    return times.parse_duration(text)


@dataclass(frozen=True)
class QueueFilter:
    """What a person asked to see; empty strings mean no filter."""

    fleet: str = ""
    """Only cases of this fleet."""
    fleets: frozenset[str] | None = None
    """The fleets the asker may see (None: every fleet): nothing else is listed or counted."""
    tool: str = ""
    """Only cases of this tool."""
    workflow: str = ""
    """Only workflows whose id contains this text."""
    older_than: timedelta | None = None
    """Only cases open at least this long."""
    kind: KindFilter = KindFilter.ALL
    """Only escalations or only approvals."""
    order: Order = Order.NEWEST
    """Newest or oldest first."""
    page: int = 1
    """1-based page number."""

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition and its parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("fleet_id", self.fleet), ("tool", self.tool), ("kind", self.kind)):
            if value:
                clauses.append(f"{column} = ?")
                params.append(str(value))
        if self.fleets is not None:
            clauses.append("list_contains(?, fleet_id)" if self.fleets else "FALSE")
            params += [sorted(self.fleets)] if self.fleets else []
        if self.workflow:
            clauses.append("contains(workflow_id, ?)")
            params.append(self.workflow)
        if self.older_than is not None:
            clauses.append("opened_at <= now() - to_seconds(?)")
            params.append(self.older_than.total_seconds())
        return (" AND ".join(clauses) or "TRUE"), params


@dataclass(frozen=True)
class QueueRow:
    """One open case in the list."""

    kind: str
    scope: str
    case_id: str | None
    workflow_id: str
    step_id: str | None
    fleet_id: str
    tool: str
    reason: str
    opened_at: datetime | None


@dataclass(frozen=True)
class QueuePage:
    """One page of the queue with the counts around it."""

    rows: tuple[QueueRow, ...]
    matching: int
    """Cases that pass the filter."""
    total: int
    """Every open case (of the fleets the asker may see)."""
    by_kind: dict[str, int] = field(default_factory=dict)
    by_fleet: dict[str, int] = field(default_factory=dict)
    by_tool: dict[str, int] = field(default_factory=dict)
    page: int = 1
    pages: int = 1
    source: str = ""
    """The file read (the snapshot, or the projection itself)."""


def snapshot_version(db_path: str | Path) -> str:
    """A token that changes whenever a new snapshot is published ('' while there is none)."""
    snap = latest_snapshot(db_path)
    try:
        info = os.stat(snap if snap is not None else db_path)
    except OSError:
        return ""
    return f"{info.st_ino:x}-{info.st_mtime_ns:x}-{info.st_size:x}"


class QueueSource:
    """Reads the queue from the newest snapshot, one connection per published snapshot;
    or from the lake the projectors commit to, through one kept connection.

    Opening a DuckDB file costs more than reading a page of it, so a connection to a
    snapshot is kept until a newer one is published; the per-fleet, per-tool and per-kind
    counts depend on the snapshot only and are kept with it.  Reads are serialised: DuckDB
    shares one database instance per path within a process, so the old connection must be
    closed (no cursor of it left) before the path is opened again, or the new connection
    would get the old file.  The projection file itself (no snapshot yet) is opened and
    closed on every read: a connection left open would keep a projector from starting.
    A lake has no file to lock: its connection is kept, and reads the lake's newest snapshot
    at each statement; its facets are kept until the lake's snapshot id moves.
    """

    def __init__(self, db_path: str | Path | LakeSource, page_size: int = PAGE_SIZE) -> None:
        self.lake = db_path if isinstance(db_path, LakeSource) else None
        """The lake read instead of a snapshot file (None: the file at ``db_path``)."""
        self.db_path = Path() if isinstance(db_path, LakeSource) else Path(db_path)
        self.page_size = page_size
        self._lock = threading.Lock()
        self._held: tuple[str, duckdb.DuckDBPyConnection, list[tuple[Any, ...]]] | None = None

    def page(self, wanted: QueueFilter) -> QueuePage:
        """One page of open cases, with totals and per-facet counts."""
        with self._connection() as (con, facets, source):
            try:
                return _read(con, facets, wanted, self.page_size, source)
            except duckdb.Error as exc:
                raise ViewStoreError(f"cannot read the queue from {source}: {exc}") from exc

    def workflow_of(self, escalation_id: str) -> str | None:
        """The workflow an escalation belongs to (None if it is not in the projection yet)."""
        with self._connection() as (con, _, source):
            try:
                row = con.execute(
                    "SELECT workflow_id FROM escalations WHERE escalation_id = ?", [escalation_id]
                ).fetchone()
            except duckdb.Error as exc:
                raise ViewStoreError(f"cannot read escalations from {source}: {exc}") from exc
        return None if row is None else str(row[0])

    def version(self) -> str:
        """A token that changes whenever there is something new to read ('' while none)."""
        if self.lake is None:
            return snapshot_version(self.db_path)
        with self._lock:
            try:
                return self._lake_held()[0]
            except ViewStoreError:
                return ""

    def close(self) -> None:
        """Close the kept connection."""
        with self._lock:
            self._drop()

    @contextlib.contextmanager
    def _connection(
        self,
    ) -> Iterator[tuple[duckdb.DuckDBPyConnection, list[tuple[Any, ...]], str]]:
        with self._lock:
            if self.lake is not None:
                version, con, facets = self._lake_held()
                yield con, facets, str(self.lake)
                return
            snap = latest_snapshot(self.db_path)
            if snap is None:
                self._drop()
                source = readable_source(self.db_path)
                con = connect_read_only(source)
                try:
                    yield con, _facets(con, str(source)), str(source)
                finally:
                    con.close()
                return
            version = snapshot_version(self.db_path)
            if self._held is None or self._held[0] != version:
                self._drop()
                con = connect_read_only(snap)
                try:
                    self._held = (version, con, _facets(con, str(snap)))
                except ViewStoreError:
                    con.close()
                    raise
            yield self._held[1], self._held[2], str(snap)

    def _lake_held(self) -> tuple[str, duckdb.DuckDBPyConnection, list[tuple[Any, ...]]]:
        """The kept lake connection, its snapshot id and the facets read at it."""
        assert self.lake is not None
        if self._held is None:
            con = connect_lake_reader(self.lake.config, self.lake.log)
            self._held = ("", con, [])
        try:
            version = lake_version(self._held[1])
        except duckdb.Error as exc:  # the catalog restarted: connect anew at the next read
            self._drop()
            raise ViewStoreError(f"cannot read {self.lake}: {first_line(exc)}") from exc
        if version != self._held[0]:
            con = self._held[1]
            self._held = (version, con, _facets(con, str(self.lake)))
        return self._held

    def _drop(self) -> None:
        if self._held is not None:
            self._held[1].close()
            self._held = None


def _facets(con: duckdb.DuckDBPyConnection, source: str) -> list[tuple[Any, ...]]:
    try:
        return con.execute(
            f"SELECT kind, fleet_id, tool, count(*) FROM ({_CASES}) GROUP BY ALL"
        ).fetchall()
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot read the queue from {source}: {exc}") from exc


def _read(
    con: duckdb.DuckDBPyConnection,
    facets: list[tuple[Any, ...]],
    wanted: QueueFilter,
    page_size: int,
    source: str,
) -> QueuePage:
    where, params = wanted.where()
    if wanted.fleets is not None:  # the counts too: another fleet's cases are not even counted
        facets = [row for row in facets if row[1] in wanted.fleets]
    direction = "DESC" if wanted.order is Order.NEWEST else "ASC"
    page = min(max(1, wanted.page), MAX_PAGE)
    found = _page_rows(con, where, params, direction, page, page_size)
    if not found and page > 1:  # past the last page: show the last one
        matching = _count(con, where, params)
        page = max(1, -(-matching // page_size))
        found = _page_rows(con, where, params, direction, page, page_size)
    matching = int(found[0][-1]) if found else 0
    rows = [row[:-1] for row in found]
    pages = max(1, -(-matching // page_size))
    return QueuePage(
        rows=tuple(QueueRow(*row) for row in rows),
        matching=matching,
        total=sum(int(n) for *_, n in facets),
        by_kind=_tally(facets, 0),
        by_fleet=_tally(facets, 1),
        by_tool=_tally(facets, 2),
        page=page,
        pages=pages,
        source=source,
    )


def _page_rows(
    con: duckdb.DuckDBPyConnection,
    where: str,
    params: list[Any],
    direction: str,
    page: int,
    page_size: int,
) -> list[tuple[Any, ...]]:
    # One pass: the page's rows, each carrying the number of cases that match.
    return con.execute(
        f"SELECT kind, scope, case_id, workflow_id, step_id, fleet_id, tool, reason, opened_at, "
        f"count(*) OVER () FROM ({_CASES}) WHERE {where} "
        f"ORDER BY opened_at {direction} NULLS LAST, workflow_id, step_id LIMIT ? OFFSET ?",
        [*params, page_size, (page - 1) * page_size],
    ).fetchall()


def _count(con: duckdb.DuckDBPyConnection, where: str, params: list[Any]) -> int:
    row = con.execute(f"SELECT count(*) FROM ({_CASES}) WHERE {where}", params).fetchone()
    return 0 if row is None else int(row[0])


def _tally(facets: list[tuple[Any, ...]], column: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in facets:
        key = str(row[column] or "")
        counts[key] = counts.get(key, 0) + int(row[-1])
    return dict(sorted(counts.items()))

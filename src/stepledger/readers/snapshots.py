"""Reading the projector's published snapshots: where they are, and one workflow's events.

The read side of :mod:`stepledger.projector.snapshot`, kept below both the SDK (whose
``SnapshotTailReader`` opens workflows from it) and the projector (which publishes it), so
the SDK never imports the projector's package.  The file names and the ``events`` and
``offsets`` tables are the contract between them.

A projection is either one DuckDB file (``ledger.duckdb``, one process) or a shard
directory: one DuckDB file per partition, ``<topic>.p<partition>.duckdb``, each written by
whichever projector of the group owns the partition and each with its own snapshot.
Readers see the directory as one database: :func:`connect_union` attaches every shard's
snapshot read-only and defines each table as the ``UNION ALL`` of the shards' (a partition's
rows live in its shard alone, so the union is exact), and each view over the union.

Without a shared volume each projector keeps its shards in a directory of its own, and a
member that lost a partition leaves a stale shard behind.  :func:`connect_union` given
several directories takes, for each partition, the snapshot whose stored offset is the
furthest: every shard is an exactly-once projection of its partition up to its offset, so
the furthest one holds everything the others do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.errors import CodecError, ViewStoreError

SNAPSHOT_SUFFIX = ".snapshot.duckdb"
DB_SUFFIX = ".duckdb"
#: Between the topic and the partition number in a shard's file name.
SHARD_MARK = ".p"

Offsets = dict[tuple[str, int], int]


def snapshot_path(db_path: str | Path) -> Path:
    """Where the snapshot of a projection file is published."""
    db = Path(db_path)
    return db.with_name(db.name.removesuffix(".duckdb") + SNAPSHOT_SUFFIX)


def is_shard_dir(db_path: str | Path) -> bool:
    """True when a projection path names a shard directory rather than one DuckDB file.

    An existing directory is one; so is a path not ending in ``.duckdb``.
    """
    path = Path(db_path)
    return _probe(path, path.is_dir) or not path.name.endswith(DB_SUFFIX)


def shard_path(directory: str | Path, topic: str, partition: int) -> Path:
    """The DuckDB file holding one partition's projection in a shard directory."""
    return Path(directory) / f"{topic}{SHARD_MARK}{partition:04d}{DB_SUFFIX}"


def shard_of(path: Path) -> tuple[str, int] | None:
    """The (topic, partition) a shard file or its snapshot holds, or None for other files."""
    name = path.name.removesuffix(SNAPSHOT_SUFFIX).removesuffix(DB_SUFFIX)
    if name == path.name:
        return None
    topic, mark, number = name.rpartition(SHARD_MARK)
    if not mark or not topic or not number.isdigit():
        return None
    return topic, int(number)


def shard_snapshots(directory: str | Path) -> dict[tuple[str, int], Path]:
    """The published snapshot of every shard in a directory, by (topic, partition)."""
    found: dict[tuple[str, int], Path] = {}
    root = Path(directory)
    if not root.is_dir():
        return found
    for path in sorted(root.glob(f"*{SNAPSHOT_SUFFIX}")):
        where = shard_of(path)
        if where is not None:
            found[where] = path
    return found


def freshest_shard_snapshots(*directories: str | Path) -> dict[tuple[str, int], Path]:
    """Each partition's snapshot with the furthest stored offset across shard directories.

    With one directory this is :func:`shard_snapshots`.  Of two snapshots at the same offset
    (identical, as exactly-once projections of the same records) the first directory's wins.
    """
    candidates: dict[tuple[str, int], list[Path]] = {}
    for directory in directories:
        for where, path in shard_snapshots(directory).items():
            candidates.setdefault(where, []).append(path)
    chosen: dict[tuple[str, int], Path] = {}
    for where, paths in candidates.items():
        if len(paths) == 1:
            chosen[where] = paths[0]
            continue
        offsets = [
            (snapshot_next_offset(path, where), -rank, path) for rank, path in enumerate(paths)
        ]
        chosen[where] = max(offsets)[2]
    return chosen


def snapshot_next_offset(snapshot: Path, where: tuple[str, int]) -> int:
    """The next offset a shard's snapshot stores for its partition (-1: none yet)."""
    con = connect_read_only(snapshot)
    try:
        row = con.execute(
            "SELECT max(next_offset) FROM offsets WHERE topic = ? AND partition = ?", list(where)
        ).fetchone()
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot read {snapshot}: {_first_line(exc)}") from exc
    finally:
        con.close()
    return -1 if row is None or row[0] is None else int(row[0])


def connect_union(*directories: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only, in-memory database whose tables are the union of every shard's snapshot.

    Given several shard directories (one per projector, no shared volume), each partition
    is read from its freshest snapshot (:func:`freshest_shard_snapshots`).  Each snapshot
    is attached ``READ_ONLY``; file access and configuration are locked before the
    connection is returned, as in :func:`connect_read_only`.
    """
    snapshots = freshest_shard_snapshots(*directories)
    where = ", ".join(str(d) for d in directories)
    if not snapshots:
        raise ViewStoreError(f"no shard snapshot in {where or 'no directory'} yet")
    con = duckdb.connect(":memory:")
    try:
        aliases = _attach(con, list(snapshots.values()))
        _union_views(con, aliases)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        con.close()
        raise ViewStoreError(f"cannot read the shards in {where}: {_first_line(exc)}") from exc
    return con


def _attach(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> list[str]:
    aliases = []
    for number, path in enumerate(paths):
        alias = f"shard{number}"
        # A literal, not a parameter: DuckDB 1.5 (the [lake] extra's pin) takes no parameter
        # in ATTACH.
        quoted = "'" + str(path).replace("'", "''") + "'"
        con.execute(f"ATTACH {quoted} AS {alias} (READ_ONLY)")
        aliases.append(alias)
    return aliases


def _union_views(con: duckdb.DuckDBPyConnection, aliases: list[str]) -> None:
    """Each table as the UNION ALL of the shards', then the first shard's views over them."""
    first = aliases[0]
    tables = [
        str(name)
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY 1", [first]
        ).fetchall()
    ]
    for table in tables:
        union = " UNION ALL ".join(f'SELECT * FROM {alias}.main."{table}"' for alias in aliases)
        con.execute(f'CREATE VIEW memory.main."{table}" AS {union}')
    views = con.execute(
        "SELECT sql FROM duckdb_views() WHERE database_name = ? AND NOT internal ORDER BY 1",
        [first],
    ).fetchall()
    for (sql,) in views:
        con.execute(str(sql))


def latest_snapshot(db_path: str | Path) -> Path | None:
    """The published snapshot of a projection file, or None if none was published yet."""
    path = snapshot_path(db_path)
    return path if _probe(path, path.is_file) else None


def _probe(path: Path, test: Callable[[], bool]) -> bool:
    """``test()`` of a path; a directory the reader may not enter is one line, not a trace.

    A fleet's projection lives in a directory only its analysts may read: another fleet's
    analyst pointing a reader at it is told so.
    """
    try:
        return test()
    except PermissionError as exc:
        raise ViewStoreError(
            f"not allowed to read {path}: {exc.strerror} (a projection's directory is "
            "readable by its own analysts only: ask for access, or name your own)"
        ) from None


def connect_read_only(path: str | Path) -> duckdb.DuckDBPyConnection:
    """Open a projection file read-only, with file access and configuration locked down."""
    try:
        return duckdb.connect(
            str(path),
            read_only=True,
            config={"enable_external_access": False, "lock_configuration": True},
        )
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot open {path} read-only: {_first_line(exc)}") from exc


def connect_projection(source: str | Path) -> duckdb.DuckDBPyConnection:
    """Open a snapshot file, or the union of a shard directory's snapshots, read-only."""
    return connect_union(source) if Path(source).is_dir() else connect_read_only(source)


def workflow_events_from_snapshot(
    path: str | Path, workflow_id: str, codec: Codec | None = None
) -> tuple[list[Event], Offsets]:
    """One workflow's events in log order from a snapshot, and the offsets it was taken at.

    Events appended after the snapshot lie at or after the returned next offsets; a reader
    that reads each partition's tail from there sees the rest of the workflow.
    """
    codec = codec or Codec()
    con = connect_read_only(path)
    try:
        values = con.execute(
            "SELECT value FROM events WHERE workflow_id = ? ORDER BY topic, partition, log_offset",
            [workflow_id],
        ).fetchall()
        offsets = con.execute("SELECT topic, partition, next_offset FROM offsets").fetchall()
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot read {path}: {_first_line(exc)}") from exc
    finally:
        con.close()
    return decoded(workflow_id, values, offsets, codec)


def decoded(
    workflow_id: str, values: list[Any], offsets: list[Any], codec: Codec
) -> tuple[list[Event], dict[tuple[str, int], int]]:
    """A workflow's stored events decoded, and the projection's offsets, from their rows
    (a snapshot's or the lake's: one decoding for both)."""
    try:
        events = [codec.decode(bytes(value)) for (value,) in values]
    except CodecError as exc:
        raise ViewStoreError(f"a stored event of {workflow_id} does not decode: {exc}") from exc
    return events, {(str(t), int(p)): int(o) for t, p, o in offsets}


def workflow_events_from_shards(
    directory: str | Path,
    partitions: list[tuple[str, int]],
    workflow_id: str,
    codec: Codec | None = None,
) -> tuple[list[Event], Offsets, list[Path]]:
    """One workflow's events from the snapshots of its partitions' shards only.

    Returns the events, the offsets the snapshots were taken at (a partition whose shard
    has no snapshot yet has none: read it from the start) and the snapshots read.
    """
    events: list[Event] = []
    offsets: Offsets = {}
    read: list[Path] = []
    for topic, partition in partitions:
        snap = latest_snapshot(shard_path(directory, topic, partition))
        if snap is None:
            continue
        found, at = workflow_events_from_snapshot(snap, workflow_id, codec)
        events.extend(found)
        offsets.update({tp: o for tp, o in at.items() if tp == (topic, partition)})
        read.append(snap)
    return events, offsets, read


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def readable_source(db_path: str | Path) -> Path:
    """What a reader should open: the published snapshot, else the file itself.

    A shard directory is returned as it is (``connect_projection`` unions its snapshots).
    """
    if is_shard_dir(db_path):
        if shard_snapshots(db_path):
            return Path(db_path)
        raise ViewStoreError(f"no shard snapshot in {db_path} yet (is a projector running?)")
    snap = latest_snapshot(db_path)
    if snap is not None:
        return snap
    path = Path(db_path)
    if path.is_file():
        return path
    raise ViewStoreError(f"no projection at {path} and no snapshot at {snapshot_path(path)}")

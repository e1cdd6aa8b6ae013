"""Reading the projector's published snapshot: where it is, and one workflow's events in it.

The read side of :mod:`stepledger.projector.snapshot`, kept below both the SDK (whose
``SnapshotTailReader`` opens workflows from it) and the projector (which publishes it), so
the SDK never imports the projector's package.  The file name and the ``events`` and
``offsets`` tables are the contract between them.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.errors import CodecError, ViewStoreError

SNAPSHOT_SUFFIX = ".snapshot.duckdb"

Offsets = dict[tuple[str, int], int]


def snapshot_path(db_path: str | Path) -> Path:
    """Where the snapshot of a projection file is published."""
    db = Path(db_path)
    return db.with_name(db.name.removesuffix(".duckdb") + SNAPSHOT_SUFFIX)


def latest_snapshot(db_path: str | Path) -> Path | None:
    """The published snapshot of a projection file, or None if none was published yet."""
    path = snapshot_path(db_path)
    return path if path.is_file() else None


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
    try:
        events = [codec.decode(bytes(value)) for (value,) in values]
    except CodecError as exc:
        raise ViewStoreError(f"a stored event of {workflow_id} does not decode: {exc}") from exc
    return events, {(str(t), int(p)): int(o) for t, p, o in offsets}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

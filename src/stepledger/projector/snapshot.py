"""Read-only snapshots: how analysts and other processes read the projection while it runs.

DuckDB lets no other process open a file another process writes, not even read-only.  So
between batches the projector checkpoints its file and copies it next to itself as
``<db stem>.snapshot.duckdb`` (``ledger.duckdb`` -> ``ledger.snapshot.duckdb``), replacing
the previous snapshot atomically with ``os.replace``.  Readers open the snapshot
read-only; one that has it open keeps reading the version it opened.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.errors import CodecError, ViewStoreError

if TYPE_CHECKING:
    from stepledger.projector.store import ProjectionStore

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


def publish_snapshot(store: ProjectionStore) -> Path:
    """Checkpoint the writer's file and atomically replace the snapshot with a copy of it.

    Must be called by the writer between transactions: after ``CHECKPOINT`` the file holds
    every committed row, and nothing writes to it until the next batch.  The copy is read
    through the store's own descriptor (opening and closing the file here would drop the
    store's lock), into a temporary name no other publisher uses.
    """
    target = snapshot_path(store.path)
    partial = target.with_name(f"{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        store.con.execute("CHECKPOINT")
        store.copy_file(partial)
        # A WAL left by someone who opened a snapshot read-write must not be replayed
        # against the next snapshot.
        Path(str(target) + ".wal").unlink(missing_ok=True)
        os.replace(partial, target)
    except (duckdb.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ViewStoreError(f"cannot publish snapshot {target}: {exc}") from exc
    return target


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


def readable_source(db_path: str | Path) -> Path:
    """The file a reader should open: the published snapshot, else the file itself."""
    snap = latest_snapshot(db_path)
    if snap is not None:
        return snap
    path = Path(db_path)
    if path.is_file():
        return path
    raise ViewStoreError(f"no projection at {path} and no snapshot at {snapshot_path(path)}")


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

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
from typing import Protocol

import duckdb

from stepledger.errors import ViewStoreError
from stepledger.readers.snapshots import (  # the read side lives below the SDK and the projector
    SNAPSHOT_SUFFIX,
    Offsets,
    connect_read_only,
    is_shard_dir,
    latest_snapshot,
    shard_snapshots,
    snapshot_path,
    workflow_events_from_snapshot,
)


class Publishable(Protocol):
    """A projection file a snapshot is published from (the file store, its writer)."""

    path: Path

    def checkpoint(self) -> bool:
        """Fold the write-ahead log into the file; False when a transaction holds it back."""
        ...

    def copy_file(self, destination: Path) -> None:
        """Copy the file, as checkpointed, to ``destination``."""
        ...


__all__ = [
    "SNAPSHOT_SUFFIX",
    "Offsets",
    "connect_read_only",
    "latest_snapshot",
    "publish_snapshot",
    "readable_source",
    "snapshot_path",
    "workflow_events_from_snapshot",
]


def publish_snapshot(store: Publishable) -> Path | None:
    """Checkpoint the writer's file and atomically replace the snapshot with a copy of it.

    Must be called by the writer between transactions: after ``CHECKPOINT`` the file holds
    every committed row, and nothing writes to it until the next batch.  The copy is read
    through the store's own descriptor (opening and closing the file here would drop the
    store's lock), into a temporary name no other publisher uses.  When another connection's
    transaction holds the checkpoint back, nothing is published (None) and the previous
    snapshot stays: the next publication catches up, and the projector goes on.
    """
    target = snapshot_path(store.path)
    if not store.checkpoint():
        return None
    partial = target.with_name(f"{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        store.copy_file(partial)
        # A WAL left by someone who opened a snapshot read-write must not be replayed
        # against the next snapshot.
        Path(str(target) + ".wal").unlink(missing_ok=True)
        os.replace(partial, target)
    except (duckdb.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ViewStoreError(f"cannot publish snapshot {target}: {exc}") from exc
    return target


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

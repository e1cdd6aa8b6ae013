"""``stepledger rebuild --db DIR``: rebuild the shards of a shard directory from offset 0.

Each partition's shard is rebuilt in place, under the fence every shard writer keeps: the
rebuild opens every shard it rebuilds read-write (DuckDB's file lock) before touching any
and holds them to the end, so a live projector holding one makes the whole rebuild refuse
at once, and a projector assigned a partition meanwhile waits for the lock.  Each shard is
emptied in one transaction (rows and offset together: the same as a missing shard), then
projected from offset 0 with the daemon's engine, rows and offset committed per batch.
A rebuild that dies halfway leaves a shard a projector continues from its stored offset.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from stepledger.config import Settings
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import ConfigError, ViewStoreError
from stepledger.kafka import topic_partitions
from stepledger.log import codec_for
from stepledger.projector.engine import DEFAULT_CACHE_WORKFLOWS, Projector
from stepledger.projector.rebuild import ProgressHook, RebuildReport, read_partitions
from stepledger.projector.schema import TABLES
from stepledger.projector.snapshot import publish_snapshot
from stepledger.projector.store import ProjectionStore
from stepledger.readers.snapshots import shard_path

Where = tuple[str, int]


def rebuild_shards(
    settings: Settings,
    directory: str | Path,
    *,
    topics: tuple[str, ...] = (),
    partitions: tuple[int, ...] = (),
    force: bool = False,
    batch_size: int = 10_000,
    cache_workflows: int = DEFAULT_CACHE_WORKFLOWS,
    group: str = "",
    progress: ProgressHook | None = None,
) -> RebuildReport:
    """Rebuild every partition's shard (or only ``partitions``) of the topics from offset 0."""
    root = Path(directory)
    wanted = _wanted(settings, topics or (settings.topic,), partitions)
    existing = [where for where in wanted if shard_path(root, *where).exists()]
    if existing and not force:
        first = shard_path(root, *existing[0])
        raise ConfigError(
            f"{len(existing)} shard(s) exist in {root} (e.g. {first.name}); "
            "pass --force to rebuild them"
        )
    root.mkdir(parents=True, exist_ok=True)
    report = RebuildReport()
    began = time.monotonic()
    stores: list[tuple[Where, ProjectionStore]] = []
    try:
        # Every shard is taken before any is touched: one held by a projector refuses the
        # whole rebuild, not half of it.
        for where in wanted:
            stores.append((where, _fenced(shard_path(root, *where))))
        codec = codec_for(settings)
        projectors = {}
        for where, store in stores:
            _empty(store)
            projectors[where] = Projector(
                store,
                codec,
                MemoryRecordLetters(),
                group=group or settings.projector_group,
                cache_workflows=cache_workflows,
            )
        read_partitions(settings, projectors, batch_size, report, progress)
        for _, store in stores:
            publish_snapshot(store)
    finally:
        for _, store in stores:
            store.close()
    report.seconds = time.monotonic() - began
    return report


def _wanted(
    settings: Settings, topics: tuple[str, ...], partitions: tuple[int, ...]
) -> list[Where]:
    wanted: list[Where] = []
    for topic in topics:
        present = topic_partitions(settings, topic)
        missing = sorted(set(partitions) - set(present))
        if missing:
            raise ConfigError(
                f"partition {missing[0]} does not exist: {topic} has partitions 0-{max(present)}"
            )
        wanted += [(topic, p) for p in (sorted(set(partitions)) or present)]
    return wanted


def _fenced(path: Path) -> ProjectionStore:
    """The shard opened read-write by this process: refused while a projector holds it."""
    try:
        return ProjectionStore(path)
    except ViewStoreError as exc:
        cause = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise ViewStoreError(
            f"shard {path} is in use (is a projector writing it?): {cause}"
        ) from exc


def _empty(store: ProjectionStore) -> None:
    """Every row and the offset removed in one transaction: as if the shard were missing."""
    con = store.con
    try:
        con.execute("BEGIN TRANSACTION")
        for table in TABLES:
            con.execute(f'DELETE FROM "{table}"')
        con.execute("COMMIT")
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        raise ViewStoreError(f"cannot empty shard {store.path}: {exc}") from exc

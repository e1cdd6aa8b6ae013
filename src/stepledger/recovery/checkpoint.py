"""The recovery daemon's own state: per-partition position and the events of its tracked steps.

The daemon never reads the projector's DuckDB file.  It keeps, per ``(group, topic,
partition)``, the next offset to read and, for every step it still tracks there (open
intents, steps in the human queue, recent recovery decisions), that step's events.  One
checkpoint is written in one SQLite transaction, so a restart resumes from a consistent
``(position, open steps)`` pair and costs O(tracked steps + events since the checkpoint).

Each partition's state names the step log it was read from (its identity, ``TOPIC@ID``,
:mod:`stepledger.logid`): a step log deleted and created again under the same name is
another log, and the state of the old one is dropped rather than resumed from (a position
there would skip the new log's records).  State written before 0.4.0 names none and is
taken as this log's (the file is the daemon's own), then named at the next checkpoint.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stepledger.domain.events import Event
from stepledger.errors import RecoveryError

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS positions (
    grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, saved_at REAL NOT NULL,
    PRIMARY KEY (grp, topic, part));
CREATE TABLE IF NOT EXISTS steps (
    grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL,
    workflow_id TEXT NOT NULL, step_id TEXT NOT NULL, events TEXT NOT NULL,
    PRIMARY KEY (grp, topic, part, workflow_id, step_id));
CREATE TABLE IF NOT EXISTS logs (
    grp TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, log TEXT NOT NULL,
    PRIMARY KEY (grp, topic, part));
"""
#: The step log's identity, asked when first needed (None: state is not checked).
Identity = Callable[[], str] | None

StepKey = tuple[str, str]


@dataclass(frozen=True)
class PartitionCheckpoint:
    """One partition's saved state: where to resume and the tracked steps' events."""

    next_offset: int
    steps: dict[StepKey, list[str]] = field(default_factory=dict)
    """(workflow, step) -> the step's events as JSON."""


@dataclass
class CheckpointBatch:
    """Changes since the last checkpoint, written together or not at all."""

    positions: dict[int, int] = field(default_factory=dict)
    """Partition -> next offset to read."""
    upserts: dict[tuple[int, str, str], list[str]] = field(default_factory=dict)
    """(partition, workflow, step) -> the step's full event list, as JSON."""
    deletes: set[tuple[int, str, str]] = field(default_factory=set)
    """Steps no longer tracked."""

    def empty(self) -> bool:
        """True when there is nothing to write."""
        return not (self.positions or self.upserts or self.deletes)


class CheckpointStore(Protocol):
    """Saves and loads the daemon's per-partition state."""

    def load(self, topic: str, partition: int) -> PartitionCheckpoint | None:
        """The partition's checkpoint, or None when it has never been checkpointed."""
        ...

    def save(self, topic: str, batch: CheckpointBatch) -> None:
        """Write a batch atomically."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


def decode_events(lines: Iterable[str]) -> list[Event]:
    """Events from their JSON."""
    return [Event.model_validate_json(line) for line in lines if line]


class SqliteCheckpointStore:
    """Checkpoints in a SQLite file (WAL); daemons of one group may share the file."""

    def __init__(self, path: str | Path, group: str, identity: Identity = None) -> None:
        self.path = Path(path)
        self.group = group
        self._identity = identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise RecoveryError(f"cannot open the recovery state {self.path}: {exc}") from None

    def load(self, topic: str, partition: int) -> PartitionCheckpoint | None:
        """The partition's checkpoint, or None when it has never been checkpointed."""
        key = (self.group, topic, partition)
        with self._lock:
            if not self._own(key):
                return None
            row = self._conn.execute(
                "SELECT next_offset FROM positions WHERE grp=? AND topic=? AND part=?", key
            ).fetchone()
            if row is None:
                return None
            rows = self._conn.execute(
                "SELECT workflow_id, step_id, events FROM steps WHERE grp=? AND topic=? AND part=?",
                key,
            ).fetchall()
        steps = {(wf, step): text.split("\n") for wf, step, text in rows}
        return PartitionCheckpoint(int(row[0]), steps)

    def _own(self, key: tuple[str, str, int]) -> bool:
        """False when the partition's state names another step log (then it is dropped)."""
        if self._identity is None:
            return True
        row = self._conn.execute(
            "SELECT log FROM logs WHERE grp=? AND topic=? AND part=?", key
        ).fetchone()
        own = self._identity()
        if row is None or row[0] == own:
            return True
        logger.warning(
            "recovery state of %s[%d] in %s was read from another step log of that name (%s, "
            "now %s: deleted and created again?): dropped, the partition is read from its start",
            key[1],
            key[2],
            self.path,
            row[0],
            own,
        )
        self._conn.execute("BEGIN IMMEDIATE")
        for table in ("positions", "steps", "logs"):
            self._conn.execute(f"DELETE FROM {table} WHERE grp=? AND topic=? AND part=?", key)
        self._conn.execute("COMMIT")
        return False

    def save(self, topic: str, batch: CheckpointBatch) -> None:
        """Write positions and step changes in one transaction."""
        if batch.empty():
            return
        grp = self.group
        upserts = [
            (grp, topic, part, wf, step, "\n".join(events))
            for (part, wf, step), events in batch.upserts.items()
        ]
        deletes = [(grp, topic, part, wf, step) for part, wf, step in batch.deletes]
        now = time.time()
        positions = [(grp, topic, part, off, now) for part, off in batch.positions.items()]
        log = None if self._identity is None else self._identity()
        logs = [] if log is None else [(grp, topic, part, log) for part in batch.positions]
        with self._lock:
            try:
                self._write(upserts, deletes, positions, logs)
            except sqlite3.Error as exc:
                raise RecoveryError(f"cannot write the recovery state: {exc}") from None

    def _write(
        self,
        upserts: list[tuple[str, str, int, str, str, str]],
        deletes: list[tuple[str, str, int, str, str]],
        positions: list[tuple[str, str, int, int, float]],
        logs: list[tuple[str, str, int, str]],
    ) -> None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "DELETE FROM steps WHERE grp=? AND topic=? AND part=? AND workflow_id=? "
                "AND step_id=?",
                deletes,
            )
            conn.executemany("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?)", upserts)
            conn.executemany(
                "INSERT OR REPLACE INTO positions VALUES (?, ?, ?, ?, ?)",
                positions,
            )
            conn.executemany("INSERT OR REPLACE INTO logs VALUES (?, ?, ?, ?)", logs)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class PartitionedCheckpointStore:
    """One SQLite checkpoint file per partition, in a directory every daemon of the group reaches.

    A partition that moves to another daemon is resumed from its own file by its next owner
    (never replayed from offset 0), and no two partitions' checkpoints contend for a lock.
    Each partition's ``(position, tracked steps)`` is still written in one transaction.
    """

    def __init__(self, directory: str | Path, group: str, identity: Identity = None) -> None:
        self.directory = Path(directory)
        self.group = group
        self._identity = identity
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stores: dict[tuple[str, int], SqliteCheckpointStore] = {}
        self._lock = threading.Lock()

    def path(self, topic: str, partition: int) -> Path:
        """The file holding one partition's checkpoint."""
        return partition_checkpoint_path(self.directory, self.group, topic, partition)

    def _store(self, topic: str, partition: int) -> SqliteCheckpointStore:
        with self._lock:
            store = self._stores.get((topic, partition))
            if store is None:
                path = self.path(topic, partition)
                store = SqliteCheckpointStore(path, self.group, self._identity)
                self._stores[(topic, partition)] = store
            return store

    def load(self, topic: str, partition: int) -> PartitionCheckpoint | None:
        """The partition's checkpoint, from its own file."""
        return self._store(topic, partition).load(topic, partition)

    def save(self, topic: str, batch: CheckpointBatch) -> None:
        """Write each partition's part of the batch into its own file, atomically per partition."""
        for partition, part in _split(batch).items():
            self._store(topic, partition).save(topic, part)

    def close(self) -> None:
        """Close every partition's file."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()


def partition_checkpoint_path(
    directory: str | Path, group: str, topic: str, partition: int
) -> Path:
    """The file of one partition's checkpoint in a shared state directory."""
    return Path(directory) / f"recovery-{group}-{topic}.p{partition:04d}.sqlite"


def _split(batch: CheckpointBatch) -> dict[int, CheckpointBatch]:
    parts: dict[int, CheckpointBatch] = {}
    for partition, offset in batch.positions.items():
        parts.setdefault(partition, CheckpointBatch()).positions[partition] = offset
    for key, events in batch.upserts.items():
        parts.setdefault(key[0], CheckpointBatch()).upserts[key] = events
    for key in batch.deletes:
        parts.setdefault(key[0], CheckpointBatch()).deletes.add(key)
    return parts


class InMemoryCheckpointStore:
    """Checkpoints in a dict, for tests and embedded use."""

    def __init__(self) -> None:
        self.positions: dict[tuple[str, int], int] = {}
        self.steps: dict[tuple[str, int], dict[StepKey, list[str]]] = {}
        self.saves = 0

    def load(self, topic: str, partition: int) -> PartitionCheckpoint | None:
        """The partition's checkpoint, or None."""
        offset = self.positions.get((topic, partition))
        if offset is None:
            return None
        steps = self.steps.get((topic, partition), {})
        return PartitionCheckpoint(offset, {k: list(v) for k, v in steps.items()})

    def save(self, topic: str, batch: CheckpointBatch) -> None:
        """Apply a batch."""
        for part, wf, step in batch.deletes:
            self.steps.get((topic, part), {}).pop((wf, step), None)
        for (part, wf, step), events in batch.upserts.items():
            self.steps.setdefault((topic, part), {})[(wf, step)] = list(events)
        for part, offset in batch.positions.items():
            self.positions[(topic, part)] = offset
        self.saves += 1

    def close(self) -> None:
        """Nothing to release."""

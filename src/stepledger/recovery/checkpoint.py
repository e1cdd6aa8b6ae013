"""The recovery daemon's own state: per-partition position and the events of its tracked steps.

The daemon never reads the projector's DuckDB file.  It keeps, per ``(group, topic,
partition)``, the next offset to read and, for every step it still tracks there (open
intents, steps in the human queue, recent recovery decisions), that step's events, so a
restart resumes from a ``(position, open steps)`` pair and costs O(tracked steps + events
since the checkpoint) instead of a replay of the partition.

This module is the port (:class:`CheckpointStore`) and its in-memory implementation for
tests and the simulator; the one store a daemon runs on is the compacted changelog topic
(:mod:`stepledger.recovery.changelog`).  The state is a cache of the log: lost, a partition
is replayed from its start once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from stepledger.domain.events import Event

StepKey = tuple[str, str]


@dataclass(frozen=True)
class PartitionCheckpoint:
    """One partition's saved state: where to resume and the tracked steps' events."""

    next_offset: int
    steps: dict[StepKey, list[str]] = field(default_factory=dict)
    """(workflow, step) -> the step's events as JSON."""


@dataclass
class CheckpointBatch:
    """Changes since the last checkpoint, written as one batch (the steps, then positions)."""

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

    def connect(self) -> None:
        """Make the state reachable (the changelog topic is created if missing)."""
        ...

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


class InMemoryCheckpointStore:
    """Checkpoints in a dict: the port's test implementation (unit tests, the simulator)."""

    def __init__(self) -> None:
        self.positions: dict[tuple[str, int], int] = {}
        self.steps: dict[tuple[str, int], dict[StepKey, list[str]]] = {}
        self.saves = 0

    def connect(self) -> None:
        """Nothing to reach."""

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

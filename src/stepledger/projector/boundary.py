"""The projector's one store boundary: what the engine, the pipeline and the daemon need.

Two implementations: :class:`~stepledger.projector.store.ProjectionStore` (a DuckDB file,
one writer for its whole life, snapshots for readers) and
:class:`~stepledger.projector.lake.LakeStore` (one partition's tables in a DuckLake, the
offset guarded by where the batch started).  Either commits a batch's rows and the offsets
they reach in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import pyarrow as pa

Offsets = dict[tuple[str, int], int]


class ViewStore(Protocol):
    """Where projected rows and their offsets are committed, and read back by the fold."""

    def offsets(self) -> Offsets:
        """The next offset to read per (topic, partition), as committed with the rows."""
        ...

    def write(self, staged: Mapping[str, pa.Table], replaced_workflows: list[str]) -> None:
        """Commit one batch's staged rows and offsets in a single transaction."""
        ...

    def count(self, table: str) -> int:
        """Number of rows in a projected table."""
        ...

    def each_workflow_id(self, take: Callable[[list[str]], None], chunk: int = 100_000) -> None:
        """Hand every projected workflow's id to ``take``, a chunk at a time."""
        ...

    def known_workflows(self, workflow_ids: list[str]) -> set[str]:
        """The subset of these workflows that has rows in the projection."""
        ...

    def history(self, workflow_ids: list[str]) -> list[tuple[str, bytes]]:
        """Stored (workflow id, value) of these workflows' events, in log order."""
        ...

    def last_event(self, topic: str, partition: int, below: int) -> tuple[int, bytes] | None:
        """The offset and value of the last event projected from a partition below an offset."""
        ...

    def publish(self) -> str | None:
        """Between batches, in the writer: make the committed rows readable at their best
        (a file's snapshot, a lake's compaction); what was published (None: nothing)."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...

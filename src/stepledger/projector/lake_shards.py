"""The lake as the projector's state: each owned partition's table set, one pipeline each.

The lake's counterpart of :class:`~stepledger.projector.shards.ShardDir`: the partition is
the unit of state (DESIGN invariant 11), its tables and offset live in the lake where any
member of the group reaches them, and a member assigned a partition opens its table set
and continues from the lake's offset.  Nothing is held back: the fence is the guarded
offset of every commit (:mod:`stepledger.projector.lake`), not a lock, so a previous owner
that has not let go yet (paused past its session) commits nothing once the new owner has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stepledger.projector.boundary import Offsets, ViewStore
from stepledger.projector.lake import LakeDatabase, LakeStore
from stepledger.projector.pipeline import Pipeline, give_up

logger = logging.getLogger(__name__)

Where = tuple[str, int]


def fenced(pipeline: Pipeline) -> str | None:
    """Why the pipeline's lake store refused a commit for a partition moved elsewhere."""
    store = pipeline.projector.store
    if isinstance(store, LakeStore) and store.fenced is not None:
        logger.warning("nothing committed after the partition moved: %s", store.fenced)
        return store.fenced
    return None


class LakeShards:
    """One lake table set per owned partition, each projected by its own pipeline."""

    def __init__(self, db: LakeDatabase, make: Callable[[ViewStore], Pipeline]) -> None:
        self.db = db
        self._make = make
        self._open: dict[Where, Pipeline] = {}

    def open(self, partitions: list[Where]) -> Offsets:
        """Open each partition's table set (created if new); the lake's offset of each."""
        offsets: Offsets = {}
        for where in partitions:
            pipeline = self._open.get(where)
            if pipeline is None:
                store = LakeStore(self.db, *where)
                if store.created:
                    # The lake's counterpart of a shard made anew: only the first owner of a
                    # partition reads it from offset 0, every later one from the lake's.
                    logger.warning(
                        "no table set for %s[%d] in the lake: projecting the partition from "
                        "offset 0",
                        *where,
                    )
                pipeline = self._open[where] = self._make(store)
            else:
                # Assigned again before it was given up: commit what is in flight first.
                pipeline.drain()
            offsets.update(pipeline.projector.reload_offsets())
        return offsets

    def close(self, partitions: list[Where]) -> None:
        """Commit what is in flight, compact when due, and close each partition's store."""
        closing = [p for where in partitions if (p := self._open.pop(where, None)) is not None]
        # A partition given up after another projector took it over (this one was paused
        # past its session): nothing of it was committed, nothing is lost.
        give_up(closing, forgiven=lambda pipeline, exc: fenced(pipeline) is not None)

    def pipeline(self, where: Where) -> Pipeline | None:
        """The pipeline of an owned partition."""
        return self._open.get(where)

    def pipelines(self) -> list[Pipeline]:
        """The pipelines of the owned partitions."""
        return list(self._open.values())

    def describe(self, where: Where) -> str:
        """The partition's table set."""
        return f"lake schema {self.db.schema}, {where[0]}[{where[1]}]"

    def held(self) -> set[Where]:
        """Nothing is held back: the guarded offset, not a lock, fences a previous owner."""
        return set()

    def take_held(self) -> dict[Where, int | None]:
        """Nothing to take."""
        return {}

    def shutdown(self) -> None:
        """Close every owned partition's store, then detach the lake."""
        try:
            self.close(list(self._open))
        finally:
            self.db.close()

"""Where a projector keeps its state: one DuckDB file, or one shard per partition.

With several ``stepledger project`` processes in one consumer group, the partition is the
unit of state (DESIGN invariant 11): each partition has its own DuckDB file in a shard
directory every instance can reach, holding that partition's rows and its offset (one
transaction per batch, as in a single file).  The instance the group assigns a partition
to opens its shard and continues from the shard's offset; a revoked partition's shard is
drained, snapshotted and closed.  DuckDB's file lock, held as long as the partition is
owned, is the fence: an instance given a partition whose previous owner has not closed it
yet (paused past its session) never writes beside it.  Such a shard is **held back** at
once, never waited for inside the assignment: the daemon assigns the partition paused,
keeps projecting the others and tries the shard again from its loop until its previous
owner lets it go (a paused process continued, which finds its partitions lost and closes
them, or killed: the OS drops its locks).  A wait inside the assignment callback held up
the whole member (none of its partitions projected, no answer to the next rebalance) for
a lock only another process can free.

:class:`OneFile` keeps the single-file projection of one process: every partition goes to
one store, opened for the process's whole life.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from stepledger.errors import ViewStoreError
from stepledger.projector.boundary import Offsets
from stepledger.projector.pipeline import Pipeline, give_up
from stepledger.projector.store import ProjectionStore
from stepledger.readers.snapshots import shard_path

logger = logging.getLogger(__name__)

#: How often a shard still held back is named again in the log.
HELD_WARN_EVERY_S = 60.0
#: How long a shard is held back before a warning names it (a handover's close is quicker).
HELD_WARN_AFTER_S = 5.0

Where = tuple[str, int]
#: Builds a pipeline (store, projector, writer thread) over an opened store.
PipelineFactory = Callable[[ProjectionStore], Pipeline]
#: Opens a store (raises ViewStoreError while another process holds its lock).
StoreOpener = Callable[[Path], ProjectionStore]


class Shards(Protocol):
    """The projector's state, as the consumer loop sees it."""

    def open(self, partitions: list[Where]) -> Offsets:
        """Take these partitions over; the next offset of each one that has state."""
        ...

    def close(self, partitions: list[Where]) -> None:
        """Give these partitions up: commit what is in flight, snapshot, release."""
        ...

    def pipeline(self, where: Where) -> Pipeline | None:
        """The pipeline projecting a partition, or None if it is not open here."""
        ...

    def pipelines(self) -> list[Pipeline]:
        """Every open pipeline (each commits in its own writer thread)."""
        ...

    def describe(self, where: Where) -> str:
        """The file a partition is projected into (for messages)."""
        ...

    def held(self) -> set[Where]:
        """Assigned partitions whose shard another owner still holds (not projected yet)."""
        ...

    def take_held(self) -> dict[Where, int | None]:
        """Try once to take every held shard; each one taken, with its stored next offset
        (None: the shard has none yet)."""
        ...

    def shutdown(self) -> None:
        """Stop and release everything (after ``close`` of what was owned)."""
        ...


class OneFile:
    """Every partition in one DuckDB file, owned by this process for its whole life."""

    def __init__(self, path: Path, pipeline: Pipeline) -> None:
        self.path = path
        self._pipeline = pipeline

    def open(self, partitions: list[Where]) -> Offsets:
        """Offsets of the partitions from the one file."""
        self._pipeline.drain()
        stored = self._pipeline.projector.reload_offsets()
        return {where: stored[where] for where in partitions if where in stored}

    def close(self, partitions: list[Where]) -> None:
        """Commit what is in flight; the file stays open."""
        self._pipeline.drain()

    def pipeline(self, where: Where) -> Pipeline | None:
        """The one pipeline."""
        return self._pipeline

    def pipelines(self) -> list[Pipeline]:
        """The one pipeline."""
        return [self._pipeline]

    def describe(self, where: Where) -> str:
        """The one file."""
        return str(self.path)

    def held(self) -> set[Where]:
        """Nothing is held back: the one file is this process's for its whole life."""
        return set()

    def take_held(self) -> dict[Where, int | None]:
        """Nothing to take."""
        return {}

    def shutdown(self) -> None:
        """Stop the writer and close the file."""
        try:
            self._pipeline.close()
        finally:
            self._pipeline.projector.store.close()


class ShardDir:
    """One DuckDB shard per partition in a directory; only owned partitions are open."""

    def __init__(
        self,
        directory: Path,
        make: PipelineFactory,
        *,
        opener: StoreOpener | None = None,
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._make = make
        self._open_store = opener or ProjectionStore
        self._open: dict[Where, Pipeline] = {}
        self._held: dict[Where, float] = {}
        """Held-back partitions and when each was assigned (monotonic seconds)."""
        self._warned: dict[Where, float] = {}
        self.created: list[Where] = []
        """Partitions whose shard was missing and are projected from offset 0."""

    def open(self, partitions: list[Where]) -> Offsets:
        """Open each partition's shard and its offset, trying each lock once.

        A shard whose lock another owner still holds is held back (:meth:`held`) at once:
        no offset is returned for it and :meth:`take_held` tries again.  Nothing here
        waits, so an assignment callback never blocks on another process.
        """
        now = time.monotonic()
        for where in partitions:
            if where in self._open:
                # Still open here (assigned again before it was given up): what is in
                # flight is committed before the offsets are read and the fold restarts.
                self._open[where].drain()
            elif not self._opened(where):
                self._held.setdefault(where, now)
        offsets: Offsets = {}
        for where in partitions:
            if where in self._open:
                offsets.update(self._offset_of(where))
        return offsets

    def _opened(self, where: Where) -> bool:
        """Open the partition's shard if its lock is free now (no wait)."""
        store = self._take(where)
        if store is None:
            return False
        self._open[where] = self._make(store)
        return True

    def _offset_of(self, where: Where) -> Offsets:
        stored = self._open[where].projector.reload_offsets()
        return {where: stored[where]} if where in stored else {}

    def held(self) -> set[Where]:
        """Assigned partitions whose shard another owner still holds."""
        return set(self._held)

    def take_held(self) -> dict[Where, int | None]:
        """Try once (no wait) to take each held shard; those taken, with their offsets."""
        taken: dict[Where, int | None] = {}
        for where in list(self._held):
            if not self._opened(where):
                self._warn_held(where)
                continue
            del self._held[where]
            self._warned.pop(where, None)
            taken[where] = self._offset_of(where).get(where)
            logger.info("took over shard %s after its previous owner released it", where)
        return taken

    def _warn_held(self, where: Where) -> None:
        now = time.monotonic()
        if now - self._held[where] < HELD_WARN_AFTER_S:
            return  # a handover's close is usually done by the next try
        if now - self._warned.get(where, -HELD_WARN_EVERY_S) < HELD_WARN_EVERY_S:
            return
        self._warned[where] = now
        path = shard_path(self.directory, *where)
        logger.warning(
            "shard %s is still locked by another owner (%.0fs after it was assigned here): "
            "%s[%d] is held back, not projected, until that owner closes it (a paused "
            "process, or one that lost the partition and has not noticed yet)",
            path,
            now - self._held[where],
            *where,
            extra={"topic": where[0], "partition": where[1], "shard": str(path)},
        )

    def _take(self, where: Where) -> ProjectionStore | None:
        path = shard_path(self.directory, *where)
        if not path.exists():
            self.created.append(where)
            logger.warning(
                "no shard for %s[%d] at %s: projecting the partition from offset 0",
                *where,
                path,
                extra={"topic": where[0], "partition": where[1], "shard": str(path)},
            )
        try:
            return self._open_store(path)
        except ViewStoreError as exc:
            # The previous owner has not closed it yet (revocation under way, or a paused
            # process that lost the partition): its lock is the fence.  Another store of
            # this process is fenced the same way.  Only a lock is waited for: any other
            # failure to open the file is raised.
            if not _locked(exc):
                raise
            return None

    def close(self, partitions: list[Where]) -> None:
        """Commit, snapshot and close each partition's shard (a held one is just let go)."""
        for where in partitions:
            self._held.pop(where, None)
            self._warned.pop(where, None)
        closing = [p for where in partitions if (p := self._open.pop(where, None)) is not None]
        give_up(closing, forgiven=lambda pipeline, exc: False)

    def pipeline(self, where: Where) -> Pipeline | None:
        """The pipeline of an owned partition."""
        return self._open.get(where)

    def pipelines(self) -> list[Pipeline]:
        """The pipelines of the owned partitions."""
        return list(self._open.values())

    def owned(self) -> Iterable[Where]:
        """The partitions whose shard is open here."""
        return list(self._open)

    def describe(self, where: Where) -> str:
        """The partition's shard file."""
        return str(shard_path(self.directory, *where))

    def shutdown(self) -> None:
        """Close every open shard."""
        self.close(list(self._open))


def _locked(exc: ViewStoreError) -> bool:
    """True when the store could not be opened because another owner holds its lock."""
    text = exc.message.lower()
    return any(sign in text for sign in _LOCK_SIGNS)


#: What DuckDB (and this process's own registry of open files) say of a file held elsewhere.
_LOCK_SIGNS = ("could not set lock", "conflicting lock", "already open in this process")

"""Overlap writing with preparing: commits and snapshots run in one writer thread.

Decoding and folding hold the GIL; DuckDB's insert, commit and checkpoint, and copying the
file, do not.  So a single writer thread commits batch N (and publishes a snapshot when
one is due) while the caller prepares batch N+1.  The writer runs its tasks in order, so a
snapshot holds exactly the batches committed before it.  At most one batch is in flight;
anything that needs the store and the fold cache to agree (a new assignment, stopping)
calls ``drain`` first.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from stepledger.projector.engine import BatchReport, PreparedBatch, Projector
from stepledger.projector.snapshot import publish_snapshot

logger = logging.getLogger(__name__)

CommitHook = Callable[[BatchReport], None]
SnapshotHook = Callable[[Path], None]


class Pipeline:
    """Feeds batches to a projector; commits and snapshots happen in a writer thread."""

    def __init__(
        self,
        projector: Projector,
        on_commit: CommitHook | None = None,
        on_snapshot: SnapshotHook | None = None,
    ) -> None:
        self.projector = projector
        self.on_commit = on_commit
        self.on_snapshot = on_snapshot
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="stepledger-writer")
        self._tasks: deque[tuple[Future[Any], Callable[[Any], None]]] = deque()

    def feed(self, records: Sequence[Message]) -> None:
        """Prepare a batch here, then hand it to the writer once the previous one committed."""
        logger.debug("batch of %d records", len(records), extra={"records": len(records)})
        began = time.perf_counter()
        batch = self.projector.prepare(records, settle=self.drain)
        self.drain()
        self.projector.cache.trim(keep=batch.touched)
        future = self._writer.submit(self._commit, batch)
        self._tasks.append((future, lambda _: self._committed(batch, began)))

    def publish(self) -> None:
        """Queue a snapshot after whatever is in flight; the caller goes on meanwhile."""
        future = self._writer.submit(publish_snapshot, self.projector.store)
        self._tasks.append((future, self._published))

    def drain(self) -> None:
        """Wait for every queued commit and snapshot; re-raise the first failure."""
        while self._tasks:
            future, done = self._tasks.popleft()
            try:
                result = future.result()
            except BaseException:
                # Cleared here, in the thread that uses the cache, not in the writer.
                self.projector.forget()
                raise
            done(result)

    def close(self) -> None:
        """Finish what is queued and stop the writer."""
        try:
            self.drain()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the writer after its current task, without looking at the outcomes."""
        self._tasks.clear()
        self._writer.shutdown(wait=True)

    def _commit(self, batch: PreparedBatch) -> None:
        self.projector.commit(batch)
        report = batch.report
        if report.oldest_at is not None:
            # Stamped here, in the writer, so it measures the commit, not when it is noticed.
            report.lag_s = (datetime.now(UTC) - report.oldest_at).total_seconds()

    def _committed(self, batch: PreparedBatch, began: float) -> None:
        report = batch.report
        report.seconds = time.perf_counter() - began
        logger.debug(
            "committed %d records (%d new events)",
            report.received,
            report.projected,
            extra={
                "received": report.received,
                "projected": report.projected,
                "lag_s": report.lag_s,
            },
        )
        if self.on_commit is not None:
            self.on_commit(report)

    def _published(self, path: Path | None) -> None:
        if path is not None and self.on_snapshot is not None:
            self.on_snapshot(path)

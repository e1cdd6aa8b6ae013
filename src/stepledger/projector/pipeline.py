"""Overlap writing with preparing: commits and snapshots run in one writer thread.

Decoding and folding hold the GIL; DuckDB's insert, commit and checkpoint, and copying the
file, do not.  So a single writer thread commits batch N (and publishes a snapshot when
one is due) while the caller prepares the next ones.  The writer runs its tasks in order,
so a snapshot holds exactly the batches committed before it.

A transaction costs about the same for ten records as for a thousand, so records fed
while the writer is busy wait for it and go in one batch: a batch is prepared and queued
at once while the writer is idle or once ``batch_size`` records wait, never as a queue of
small ones that each pay a commit (at a low rate that queue was most of the lag, see
docs/benchmarks.md, "A fleet").  Up to ``depth`` full batches may wait for the writer: a
snapshot (a checkpoint and a copy of the file, seconds past a million events) then holds
the caller back only when it has prepared that many.  Once a commit fails the writer
commits nothing after it (those batches were folded on top of the failed one).  Anything
that needs the store and the fold cache to agree (a new assignment, stopping) calls
``drain`` first.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from stepledger.errors import ViewStoreError
from stepledger.kafka.records import Consumed
from stepledger.projector.engine import BatchReport, PreparedBatch, Projector

logger = logging.getLogger(__name__)

CommitHook = Callable[[BatchReport], None]
SnapshotHook = Callable[[str, float], None]
"""Called with what was published (a snapshot's path, a lake's compacted tables) and the
seconds it took."""

#: Batches that may wait for the writer (each holds its staged rows: a few MB at most).
DEFAULT_DEPTH = 4
#: Most records in one batch (one transaction) unless the caller says otherwise.
DEFAULT_BATCH_SIZE = 10_000


class Pipeline:
    """Feeds batches to a projector; commits and snapshots happen in a writer thread."""

    def __init__(
        self,
        projector: Projector,
        on_commit: CommitHook | None = None,
        on_snapshot: SnapshotHook | None = None,
        *,
        depth: int = DEFAULT_DEPTH,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.projector = projector
        self.on_commit = on_commit
        self.on_snapshot = on_snapshot
        self.depth = max(1, depth)
        self.batch_size = max(1, batch_size)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="stepledger-writer")
        self._tasks: deque[_Commit | _Snapshot] = deque()
        self._waiting: list[Consumed] = []
        """Records fed while the writer was busy, for the next batch (in the order fed)."""
        self._failed = False
        """A commit failed (set by the writer): later queued tasks write nothing."""
        self.snapshot_s = 0.0
        """How long the last snapshot took (checkpoint and copy; set by the writer)."""
        self.published_at = float("-inf")
        """When the last snapshot was queued (``time.monotonic``)."""

    def feed(self, records: Sequence[Consumed]) -> None:
        """Take records: a batch goes to the writer now if it is idle or the batch is full,
        else the records wait for it (``pump``)."""
        self._waiting.extend(records)
        self.pump()

    def pump(self) -> None:
        """Hand what waits to the writer: every full batch (waiting while ``depth`` are
        queued), and the rest once the writer is idle.  Called after each poll."""
        self._reap()
        while len(self._waiting) >= self.batch_size:
            self._queue(self._take(self.batch_size))
        if self._waiting and not self._tasks:
            self._queue(self._take(len(self._waiting)))

    def publish(self) -> None:
        """Queue a snapshot after everything fed so far; the caller goes on meanwhile."""
        self._flush()
        self.published_at = time.monotonic()
        self._tasks.append(_Snapshot(self._writer.submit(self._publish)))

    def drain(self) -> None:
        """Commit everything fed and wait for every queued snapshot; re-raise the first
        failure."""
        self._flush()
        self._wait()

    def _flush(self) -> None:
        """Queue every waiting record, in batches of at most ``batch_size``."""
        while self._waiting:
            self._queue(self._take(self.batch_size))

    def _take(self, count: int) -> list[Consumed]:
        taken, self._waiting = self._waiting[:count], self._waiting[count:]
        return taken

    def _queue(self, records: Sequence[Consumed]) -> None:
        """Prepare a batch here, then queue it for the writer once fewer than ``depth`` wait."""
        logger.debug("batch of %d records", len(records), extra={"records": len(records)})
        began = time.perf_counter()
        batch = self.projector.prepare(records, settle=self._wait)
        self._settle(self.depth - 1)
        # The store lacks what is still queued: those workflows must stay in the cache.
        keep = batch.touched.union(
            *(t.batch.touched for t in self._tasks if isinstance(t, _Commit))
        )
        self.projector.cache.trim(keep=keep)
        self._tasks.append(_Commit(self._writer.submit(self._commit, batch), batch, began))

    def _wait(self) -> None:
        """Wait for every queued commit and snapshot (not for records still waiting)."""
        self._settle(0)
        while self._tasks:
            self._finish(self._tasks.popleft())

    def _reap(self) -> None:
        """Finish the tasks the writer is done with (in order: it runs them in order)."""
        while self._tasks and self._tasks[0].future.done():
            self._finish(self._tasks.popleft())

    def _settle(self, commits: int) -> None:
        """Wait for queued tasks, in order, until at most ``commits`` commits are queued."""
        queued = sum(isinstance(t, _Commit) for t in self._tasks)
        while queued > commits:
            task = self._tasks.popleft()
            queued -= isinstance(task, _Commit)
            self._finish(task)

    def _finish(self, task: _Commit | _Snapshot) -> None:
        try:
            result = task.future.result()
        except BaseException:
            # Cleared here, in the thread that uses the cache, not in the writer.
            self.projector.forget()
            raise
        if isinstance(task, _Commit):
            self._committed(task.batch, task.began)
        elif result is not None:
            self._published(*result)

    def close(self) -> None:
        """Finish what is queued and stop the writer."""
        try:
            self.drain()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the writer after its current task, without looking at the outcomes (records
        still waiting are dropped: the store's offsets say where to read them again)."""
        self._tasks.clear()
        self._waiting.clear()
        self._writer.shutdown(wait=True)

    def _commit(self, batch: PreparedBatch) -> None:
        if self._failed:
            raise ViewStoreError("not committed: an earlier batch's commit failed")
        try:
            self.projector.commit(batch)
        except BaseException:
            self._failed = True
            raise
        report = batch.report
        if report.oldest_at is not None:
            # Stamped here, in the writer, so it measures the commit, not when it is noticed.
            report.lag_s = (datetime.now(UTC) - report.oldest_at).total_seconds()

    def _publish(self) -> tuple[str, float] | None:
        if self._failed:
            return None  # the store may be fine, but the caller is about to stop
        began = time.perf_counter()
        try:
            path = self.projector.store.publish()
        finally:
            self.snapshot_s = time.perf_counter() - began
        return None if path is None else (path, self.snapshot_s)

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

    def _published(self, path: str, seconds: float) -> None:
        if self.on_snapshot is not None:
            self.on_snapshot(path, seconds)


@dataclass(frozen=True, slots=True)
class _Commit:
    """A batch handed to the writer: committed when its future is done."""

    future: Future[None]
    batch: PreparedBatch
    began: float
    """When preparing the batch began (``perf_counter``), for the batch's duration."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """A snapshot queued behind the commits: its future holds the published path and the
    seconds it took, if it was published."""

    future: Future[tuple[str, float] | None]


def give_up(
    pipelines: Sequence[Pipeline], forgiven: Callable[[Pipeline, ViewStoreError], bool]
) -> None:
    """Commit what each pipeline has in flight, publish, and close it and its store, every one
    even when another failed (the first failure is raised after all are closed); a store
    error ``forgiven`` says nothing was lost by (a fenced lake partition) is not raised."""
    failures: list[BaseException] = []
    for pipeline in pipelines:
        try:
            pipeline.drain()
            pipeline.publish()
            pipeline.close()
        except ViewStoreError as exc:
            if not forgiven(pipeline, exc):
                failures.append(exc)
        except BaseException as exc:  # every store must still be closed
            failures.append(exc)
        finally:
            pipeline.stop()
            pipeline.projector.store.close()
    if failures:
        raise failures[0]

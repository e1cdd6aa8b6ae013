"""Overlap committing one batch with preparing the next.

Decoding and folding hold the GIL; DuckDB's insert and commit do not.  So a single writer
thread commits batch N while the caller prepares batch N+1.  At most one batch is in
flight; anything that needs the store and the fold cache to agree (a snapshot, a new
assignment, stopping) calls ``drain`` first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

from confluent_kafka import Message

from stepledger.projector.engine import BatchReport, PreparedBatch, Projector

log = logging.getLogger(__name__)

CommitHook = Callable[[BatchReport], None]


class Pipeline:
    """Feeds batches to a projector, committing each in a writer thread."""

    def __init__(self, projector: Projector, on_commit: CommitHook | None = None) -> None:
        self.projector = projector
        self.on_commit = on_commit
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="stepledger-writer")
        self._in_flight: tuple[Future[None], PreparedBatch, float] | None = None

    def feed(self, records: Sequence[Message]) -> None:
        """Prepare a batch here, then hand it to the writer once the previous one committed."""
        log.debug("batch of %d records", len(records), extra={"records": len(records)})
        began = time.perf_counter()
        batch = self.projector.prepare(records)
        self.drain()
        self.projector.cache.trim(keep=batch.touched)
        self._in_flight = (self._writer.submit(self._commit, batch), batch, began)

    def _commit(self, batch: PreparedBatch) -> None:
        self.projector.commit(batch)
        report = batch.report
        if report.oldest_at is not None:
            # Stamped here, in the writer, so it measures the commit, not when it is noticed.
            report.lag_s = (datetime.now(UTC) - report.oldest_at).total_seconds()

    def drain(self) -> None:
        """Wait until the batch in flight (if any) is committed; re-raise its failure."""
        if self._in_flight is None:
            return
        future, batch, began = self._in_flight
        self._in_flight = None
        future.result()
        report = batch.report
        report.seconds = time.perf_counter() - began
        log.debug(
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

    def close(self) -> None:
        """Commit what is in flight and stop the writer."""
        try:
            self.drain()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the writer after its current commit, without looking at the outcome."""
        self._in_flight = None
        self._writer.shutdown(wait=True)

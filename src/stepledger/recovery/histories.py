"""Held steps' workflows, read on the daemon's workers; the tracker judges what was read.

A step the tracker holds back (``recovery.reopen``: let go of, then reopened by a
compensation's intent; or an intent of a workflow whose claims the daemon does not know) is
read back once it is past its own deadline plus the grace.  The read
goes through the daemon's workflow history (by default the SDK's own: the workflow's
partition from its first record on, completed from checkpoints where the log's head
expired) on one of the daemon's workers, never on the loop, which only hands due reads out
and takes their answers in.  One read runs at a time: reads are rare (most reopenings end
with the compensation's outcome, unread), and a broker too slow to answer a read then
holds one worker, never every worker the resolutions need.  A read that fails is tried
again after a doubling back-off, up to :data:`READ_ATTEMPTS` reads; past that, or at once
for an error retrying cannot help (a history the broker deleted with no checkpoint
covering it), the step is let go of with one error line naming the workflow: a person
resumes it or answers it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.factory import Clock
from stepledger.errors import StepLedgerError
from stepledger.history.protocol import WorkflowHistory
from stepledger.recovery.tracker import StepKey, Tracker
from stepledger.recovery.work import WorkPool

logger = logging.getLogger(__name__)

#: Reads running at once (each on a worker the resolutions share).
READS_AT_ONCE = 1
#: Reads of a reopened step's workflow before the step is let go of.
READ_ATTEMPTS = 8
#: The back-off after the first failed read (doubling, capped by MAX_BACKOFF_S).
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class HistoryReads:
    """Hands due reopened steps' reads to the workers and takes what they read in."""

    def __init__(
        self,
        tracker: Tracker,
        history: WorkflowHistory,
        clock: Clock,
        *,
        on_given_up: Callable[[], None] = lambda: None,
    ) -> None:
        self.tracker, self.history, self.clock = tracker, history, clock
        self.on_given_up = on_given_up
        """Told when a step is let go of unread (a metric counts it)."""
        self.reading = 0
        """Reads handed to the workers and not taken in yet."""

    def dispatch(self, work: WorkPool, partitions: set[int]) -> None:
        """Hand the reads due now, of these partitions, to the daemon's free workers."""
        reopenings = self.tracker.reopenings
        room = min(work.free, READS_AT_ONCE - self.reading)
        if not len(reopenings) or room <= 0:
            return
        for key in reopenings.due(self.clock(), room, partitions):
            partition = reopenings.steps[key].partition
            self.reading += 1
            work.read(key, partition, self._finished, self._read, key[0])

    def _read(self, workflow_id: str) -> list[ev.Event]:
        return self.history.read(workflow_id).events

    def _finished(self, key: StepKey, future: Future[Any]) -> None:
        self.reading -= 1
        if future.cancelled():
            return  # queued for a partition that moved away: forgotten with it
        try:
            history: list[ev.Event] = future.result()
        except Exception as exc:
            self._failed(key, exc)
            return
        state = self.tracker.reopened(key, history)
        if state is None:
            return  # its compensation ended meanwhile, or its partition moved
        step = state.steps.get(key[1])
        where: dict[str, Any] = {
            "workflow_id": key[0],
            "step_id": key[1],
            "status": None if step is None else step.status.value,
        }
        if key in self.tracker.steps:
            logger.info("tracked after its workflow was read: the step is in doubt", extra=where)
            return
        where["anomalies"] = [a.kind for a in state.anomalies if a.step_id == key[1]]
        logger.info("not tracked: the log's fold leaves the step nothing to decide", extra=where)

    def _failed(self, key: StepKey, exc: Exception) -> None:
        reopening = self.tracker.reopenings.get(key)
        if reopening is None or not reopening.busy:
            return
        error = f"{type(exc).__name__}: {exc}"
        where = {"workflow_id": key[0], "step_id": key[1], "error": error[:500]}
        retryable = not isinstance(exc, StepLedgerError) or exc.retryable
        if retryable and reopening.failures + 1 < READ_ATTEMPTS:
            delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0**reopening.failures)
            self.tracker.reopenings.failed(key, self.clock() + timedelta(seconds=delay))
            logger.warning("could not read a reopened step's workflow; trying again", extra=where)
            return
        self.tracker.reopenings.pop(key)
        self.on_given_up()
        logger.error(
            "a step left in doubt is not decided: its workflow could not be read; resume the "
            "workflow or answer it by hand",
            extra=where,
        )

    def close(self) -> None:
        """Close the history."""
        self.history.close()

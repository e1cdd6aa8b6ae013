"""Whether a workflow's history read from the log is all of it, or comes from checkpoints.

Retention (or ``DeleteRecords``) removes the head of a partition: a reader that reads "from
the beginning" silently starts at the log start.  For a workflow that means a partial
history, and for one whose records all expired, an id that looks new: opening it would
run its steps again.  :class:`HistoryGuard` composes the log's tail with the checkpoint
topic:

- log start 0 (the usual case, and always on Tansu): the tail is everything;
- the workflow's checkpoint covers up to the log start (or the partition's checkpointer
  progress does): the checkpoint's values, then the tail's events not in it;
- the partition's progress covers the log start and the workflow has no checkpoint: none
  of its records expired; the tail is everything (a new id is proven new);
- the tail starts with the workflow's first start (``workflow_started`` attempt 1): it
  began after the log start;
- otherwise :class:`~stepledger.errors.HistoryExpiredError`: never run as new.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

from stepledger.checkpoints.view import CheckpointView, Covering
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.errors import CodecError, EventValidationError, HistoryExpiredError
from stepledger.kafka.gaps import Gap, LogStart, report_gap
from stepledger.kafka.topics import topic_exists

logger = logging.getLogger(__name__)


class LogStarts(Protocol):
    """Where each partition starts and ends now (a :class:`~stepledger.kafka.gaps.LogStart`)."""

    def of(self, topic: str, partition: int) -> int: ...

    def end(self, topic: str, partition: int) -> int: ...

    def close(self) -> None: ...


class Checkpoints(Protocol):
    """What the checkpoint topic says (a :class:`~stepledger.checkpoints.view.CheckpointView`)."""

    def lookup(self, partition: int, workflow_id: str, *, fresh: bool = True) -> Covering: ...

    def holds(self, partition: int, workflow_id: str) -> bool | None: ...


class HistoryGuard:
    """Completes a workflow's tail with its checkpoint, or refuses when history expired.

    ``log_start`` and ``checkpoints`` default to the broker's (given: for tests).
    """

    def __init__(
        self,
        settings: Settings,
        codec: Codec,
        *,
        log_start: LogStarts | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec
        self.log_start: LogStarts = log_start or LogStart(settings)
        self._view: Checkpoints | None = checkpoints
        self._has_checkpoints: bool | None = None if checkpoints is None else True

    def complete(
        self, workflow_id: str, partition: int, tail: list[ev.Event], read_from: int = 0
    ) -> list[ev.Event]:
        """The workflow's whole history: ``tail`` made complete.

        ``tail`` holds every event of the workflow from ``read_from`` on (0: the log's
        beginning; a snapshot's offset when the events below it came from the snapshot).
        """
        topic = self.settings.topic
        low = self.log_start.of(topic, partition)
        if low <= read_from:
            return tail
        if tail and _first_start(tail[0]):
            return tail
        # What the view already read proves as much as a fresh read would (a checkpoint and
        # the progress that vouches for it are read in log order), so the checkpoint topic
        # is read again only when the cached answer proves nothing.
        for fresh in (False, True):
            if fresh and not self._has_checkpoints:
                self._has_checkpoints = None  # created since the last look?
            done = self._with_checkpoint(self._covering(partition, workflow_id, fresh), low, tail)
            if done is not None:
                return done
        report_gap(Gap(topic, partition, 0, low), f"sdk: workflow {workflow_id}")
        raise HistoryExpiredError(
            f"workflow {workflow_id!r}: {topic}[{partition}] no longer holds its history "
            f"(first offset still there: {low}) and no checkpoint covers it; it is not run "
            "as new (run a checkpointer, or start a known-new id with Ledger.start)",
            workflow_id=workflow_id,
            topic=topic,
            partition=partition,
            log_start=low,
        )

    @property
    def has_checkpoints(self) -> bool:
        """True when the checkpoint topic exists (asked of the broker once)."""
        if self._has_checkpoints is None:
            self._has_checkpoints = topic_exists(self.settings, self.settings.checkpoint_topic)
        return self._has_checkpoints

    def covering(self, partition: int, workflow_id: str, *, fresh: bool) -> Covering | None:
        """What the checkpoint topic says of the workflow (None: there is no checkpoint
        topic).  Not ``fresh``: the directory's answer for a partition the view never read
        (a handful of point reads), else what the view read so far."""
        return self._covering(partition, workflow_id, fresh)

    def holds(self, partition: int, workflow_id: str) -> bool | None:
        """Whether the checkpoints read whole hold one of the workflow, with no round trip
        (None: the view cannot say now)."""
        return None if self._view is None else self._view.holds(partition, workflow_id)

    def saw_topics(self, topics: Collection[str]) -> None:
        """A topic listing the caller made anyway: whether the checkpoint topic exists."""
        if self._has_checkpoints is None:
            self._has_checkpoints = self.settings.checkpoint_topic in topics

    def close(self) -> None:
        """Close the clients."""
        self.log_start.close()

    def _with_checkpoint(
        self, covering: Covering | None, low: int, tail: list[ev.Event]
    ) -> list[ev.Event] | None:
        """The whole history if the checkpoint topic proves it complete, else None."""
        if covering is None:
            return None
        checkpoint, progress = covering.checkpoint, covering.progress
        covers_start = progress is not None and progress >= low - 1
        if checkpoint is not None and (covers_start or checkpoint.covered_offset >= low - 1):
            stored = self._decode(checkpoint.events)
            seen = {e.event_id for e in stored}
            return stored + [e for e in tail if e.event_id not in seen]
        if checkpoint is None and covers_start and not covering.doubtful:
            return tail
        return None

    def _covering(self, partition: int, workflow_id: str, fresh: bool) -> Covering | None:
        if self._has_checkpoints is None:
            self._has_checkpoints = topic_exists(self.settings, self.settings.checkpoint_topic)
        if not self._has_checkpoints:
            return None
        if self._view is None:
            # Only this log's checkpoints, and only what its ends do not contradict: a
            # progress of another log, or past this one's end, proves no id new.
            self._view = CheckpointView(self.settings, log_ends=self.log_start)
        return self._view.lookup(partition, workflow_id, fresh=fresh)

    def _decode(self, values: tuple[bytes, ...]) -> list[ev.Event]:
        events: list[ev.Event] = []
        for value in values:
            try:
                events.append(self.codec.decode(value))
            except (CodecError, EventValidationError) as exc:
                logger.warning("skipped an undecodable checkpointed record: %s", exc)
        return events


def _first_start(event: ev.Event) -> bool:
    body = event.body
    return isinstance(body, ev.WorkflowStarted) and body.attempt == 1

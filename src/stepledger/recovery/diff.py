"""The recovery tracker's checkpoint diff: what changed since the last batch, and the batch.

The tracker (``recovery.tracker``) marks what its events changed; a checkpoint takes the
changes of the partitions it may write as one batch (the changed steps' events as lines,
the steps no longer kept, the partitions' positions, the reopenings' changes) and drops
what needs no tracking any more.  No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from stepledger.domain.enums import Source
from stepledger.domain.resolution import ACTIONABLE
from stepledger.domain.times import later
from stepledger.recovery.checkpoint import CheckpointBatch, StepKey
from stepledger.recovery.reopen import CLAIMS, Reopenings
from stepledger.recovery.tracked import FoldCache, Tracked, decoded, json_lines


class CheckpointDiff:
    """The changes a tracker keeps for its next checkpoint batch."""

    steps: dict[StepKey, Tracked]
    positions: dict[int, int]
    reopenings: Reopenings

    def __init__(self, retain: timedelta) -> None:
        self.retain = retain
        """How long a decision by recovery or a person stays tracked (for late outcomes)."""
        self._folds = FoldCache()
        self._dirty: set[StepKey] = set()
        """Steps whose events changed since the last batch: written by the next one."""
        self.changed = 0
        """Changes to tracked steps since the last batch (its lines are made at the next)."""
        self._check: set[StepKey] = set()
        """Steps a resolution released: the next batch checks whether they are still kept."""
        self._removed: set[tuple[int, str, str]] = set()
        self._moved: set[int] = set()

    def take_batch(
        self,
        now: datetime,
        *,
        sweep: bool = False,
        writable: Callable[[int], bool] = lambda partition: True,
    ) -> CheckpointBatch:
        """Drop what needs no tracking and return everything changed since the last batch.

        Changed steps are checked every time; ``sweep`` also expires retained decisions.
        Changes of a partition that is not ``writable`` (its ownership in doubt) stay
        pending: written by a later batch once it is, or dropped with the partition.
        """
        checked = list(self.steps) if sweep else [*self._dirty, *self._check]
        self._check = set()
        self.changed = 0
        for key in checked:
            tracked = self.steps.get(key)
            if tracked is not None and not tracked.busy and not self._keep(tracked, now):
                del self.steps[key]
                self._folds.drop(key)
                self._dirty.discard(key)
                self._removed.add((tracked.partition, *key))
        moved = {p for p in self._moved if writable(p)}
        batch = CheckpointBatch(positions={p: self.positions[p] for p in moved})
        held: set[StepKey] = set()
        for key in self._dirty:
            tracked = self.steps.get(key)
            if tracked is None:
                continue
            if writable(tracked.partition):
                batch.upserts[(tracked.partition, *key)] = self._lines(key, tracked)
            else:
                held.add(key)
        batch.deletes = {r for r in self._removed if writable(r[0])}
        self._dirty = held
        self._removed -= batch.deletes
        self.reopenings.batch(batch.upserts, batch.deletes, writable)
        batch.deletes -= batch.upserts.keys()  # a reopened step tracked again: replaced
        self._moved -= moved
        return batch

    def _lines(self, key: StepKey, tracked: Tracked) -> list[str]:
        folded = self._folds.get(key, tracked.values)
        if folded is not None and not tracked.busy and not self._echo_pending(tracked):
            self._folds.drop(key)  # written, and no resolution of it under way: done
        if not self.vouches_claims(key[0], tracked.partition):
            # Claims only assumed here (a start read after a take-over taken as the first)
            # are not saved: restored, a checkpoint's claims are taken as known for sure.
            # Saved without them, the step is held at the next take-over and its workflow
            # read back before it is decided (:meth:`Reopenings.restore`).
            events = folded.events if folded is not None else decoded(tracked.values)
            return [e.model_dump_json() for e in events if not isinstance(e.body, CLAIMS)]
        if folded is not None:
            return [event.model_dump_json() for event in folded.events]
        return json_lines(tracked.values)

    def vouches_claims(self, workflow_id: str, partition: int) -> bool:
        """Whether the workflow's claims are known without an assumed first start (the
        tracker knows; a diff alone vouches for what it is given)."""
        return True

    def _keep(self, tracked: Tracked, now: datetime) -> bool:
        if tracked.status in ACTIONABLE or tracked.escalated:
            return True
        by = tracked.resolved_by
        if by is None or by is Source.AGENT or tracked.resolved_at is None:
            return False
        # Decided by recovery or a human: a slow agent's outcome may still come.
        return now < later(tracked.resolved_at, self.retain)

    def _echo_pending(self, tracked: Tracked) -> bool:
        return self.positions.get(tracked.partition, 0) <= tracked.echo_offset

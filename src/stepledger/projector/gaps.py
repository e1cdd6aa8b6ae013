"""Gaps in the projection: partitions whose stored position is below the log start.

On assignment the projector compares each partition's next offset (0 for a partition it
never projected) with the partition's log start.  A gap is logged (one line), counted
(``stepledger_projector_records_lost``) and written to the ``gaps`` table together with
the new position (the log start) in one transaction, so a restart neither loses nor
repeats it; projecting then goes on from the log start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from stepledger.checkpoints.view import LogEnds
from stepledger.config import Settings
from stepledger.history.checkpointed import checkpointed_records
from stepledger.kafka.gaps import Gap, LogStart, report_gap
from stepledger.projector.boundary import Offsets, ViewStore
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.store import stage

logger = logging.getLogger(__name__)

#: The projection store of a partition (None: not open here).
StoreOf = Callable[[tuple[str, int]], ViewStore | None]
#: Restores what a gap lost from elsewhere; True when nothing is left missing.
Restore = Callable[[Gap], bool]
_FEED = 5000


def restore_from_checkpoints(
    settings: Settings, pipeline: Pipeline, gap: Gap, log_ends: LogEnds | None = None
) -> bool:
    """Project the gap's records from the workflow checkpoints, at their own offsets.

    Only when the partition's checkpoint progress reaches the log start (every workflow
    with a record in the gap has a checkpoint holding it) and every checkpoint knows its
    records' offsets; otherwise nothing is projected and False says the gap stays.  Only
    checkpoints of this step log count (a shared checkpoint topic holds others' too).
    """
    if gap.topic != settings.topic:
        return False
    records = checkpointed_records(
        settings, gap.partition, gap.expected_offset, gap.log_start, log_ends
    )
    if records is None:
        return False
    for start in range(0, len(records), _FEED):
        pipeline.feed(records[start : start + _FEED])
    pipeline.drain()
    logger.info(
        "projector: %s[%d] restored %d records below the log start %d from %s",
        gap.topic,
        gap.partition,
        len(records),
        gap.log_start,
        settings.checkpoint_topic,
    )
    return True


def gap_rows(gaps: list[Gap], detected_by: str) -> dict[str, list[object]]:
    """The ``gaps`` table's columns for these gaps."""
    now = datetime.now(UTC)
    return {
        "topic": [g.topic for g in gaps],
        "partition": [g.partition for g in gaps],
        "expected_offset": [g.expected_offset for g in gaps],
        "log_start": [g.log_start for g in gaps],
        "records_lost": [g.records_lost for g in gaps],
        "detected_at": [now for _ in gaps],
        "detected_by": [detected_by for _ in gaps],
    }


def record_gaps(
    log_start: LogStart,
    wanted: list[tuple[str, int]],
    stored: Offsets,
    store_of: StoreOf,
    detected_by: str,
    restore: Restore | None = None,
) -> tuple[list[Gap], set[Gap]]:
    """Find, report and persist the gaps of newly assigned partitions; ``stored`` moves on.

    A gap ``restore`` fills (from the workflow checkpoints) is no gap: only the partition's
    offset moves to the log start.  Each remaining gap's row and its partition's new offset
    commit in one transaction of the partition's own store.  Returns every gap found, and
    which of them were restored.
    """
    gaps = log_start.gaps({where: stored.get(where, 0) for where in wanted})
    restored: set[Gap] = set()
    for gap in gaps:
        where = (gap.topic, gap.partition)
        store = store_of(where)
        if restore is not None and restore(gap):
            restored.add(gap)
            if store is not None:
                store.write(stage({}, {where: gap.log_start}), [])
        else:
            report_gap(gap, "projector")
            if store is not None:
                rows = {"gaps": gap_rows([gap], detected_by)}
                store.write(stage(rows, {where: gap.log_start}), [])
        stored[where] = gap.log_start
    return gaps, restored

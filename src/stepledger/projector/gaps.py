"""Gaps in the projection: partitions whose stored position is below the log start.

On assignment the projector compares each partition's next offset (0 for a partition it
never projected) with the partition's log start.  A gap is logged (one line), counted
(``stepledger_projector_records_lost``) and written to the ``gaps`` table together with
the new position (the log start) in one transaction, so a restart neither loses nor
repeats it; projecting then goes on from the log start.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from stepledger.gaps import Gap, LogStart, report_gap
from stepledger.projector.store import Offsets, ProjectionStore, stage

#: The projection store of a partition (None: not open here).
StoreOf = Callable[[tuple[str, int]], ProjectionStore | None]


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
) -> list[Gap]:
    """Find, report and persist the gaps of newly assigned partitions; ``stored`` moves on.

    Each gap's row and its partition's new offset commit in one transaction of the
    partition's own store.
    """
    gaps = log_start.gaps({where: stored.get(where, 0) for where in wanted})
    for gap in gaps:
        where = (gap.topic, gap.partition)
        report_gap(gap, "projector")
        store = store_of(where)
        if store is not None:
            store.write(stage({"gaps": gap_rows([gap], detected_by)}, {where: gap.log_start}), [])
        stored[where] = gap.log_start
    return gaps

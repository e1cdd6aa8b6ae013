"""A partition's records below its log start, as the workflow checkpoints hold them.

The step log's history past retention: the projector restores a gap from here (every
workflow's checkpoint holds its records' values and offsets), as the Kafka history
completes one workflow from its checkpoint (:mod:`stepledger.history.guard`).
"""

from __future__ import annotations

from stepledger.checkpoints.record import PROGRESS_KEY
from stepledger.checkpoints.view import CheckpointView, LogEnds
from stepledger.config import Settings
from stepledger.kafka.records import Consumed
from stepledger.kafka.topics import topic_exists


def checkpointed_records(
    settings: Settings, partition: int, start: int, below: int, log_ends: LogEnds | None = None
) -> list[Consumed] | None:
    """The step log's records of ``partition`` from ``start`` up to ``below``, in offset order.

    Only when the partition's checkpoint progress reaches ``below`` (every workflow with a
    record there has a checkpoint holding it) and every checkpoint knows its records'
    offsets; otherwise None (the checkpoints cannot give them all).  Only checkpoints of
    this step log count (a shared checkpoint topic holds others' too).
    """
    if not topic_exists(settings, settings.checkpoint_topic):
        return None
    view = CheckpointView(settings, log_ends=log_ends)
    try:
        latest = view.partition(partition)
    finally:
        view.close()
    progress = latest.pop(PROGRESS_KEY, None)
    if progress is None or progress.covered_offset < below - 1:
        return None
    if any(len(c.offsets) != len(c.events) or -1 in c.offsets for c in latest.values()):
        return None
    found = sorted(
        (offset, key, value)
        for key, checkpoint in latest.items()
        for offset, value in zip(checkpoint.offsets, checkpoint.events, strict=True)
        if start <= offset < below
    )
    topic = settings.topic
    return [Consumed(topic, partition, offset, key, value) for offset, key, value in found]

"""Gaps: a reader whose position is below the log start says so, in one line and a metric.

Retention (or ``DeleteRecords``) moves a partition's log start forward.  A reader asked to
read from an offset below it gets the records from the log start on (``auto.offset.reset``)
and, unless it looks, carries on as if it had read everything.  Every reader (the projector,
recovery, a rebuild, ``tail``, the SDK) compares where it meant to start with the log start
through :class:`LogStart` and reports a :class:`Gap` with :func:`report_gap`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepledger import wire
from stepledger.config import Settings
from stepledger.kafka.reader import PartitionReader

logger = logging.getLogger(__name__)

_WATERMARK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Gap:
    """Records a reader needed that the log no longer holds."""

    topic: str
    partition: int
    expected_offset: int
    """Where the reader meant to go on from."""
    log_start: int
    """The first offset the partition still holds."""

    @property
    def records_lost(self) -> int:
        """How many offsets between the two are gone."""
        return self.log_start - self.expected_offset

    def line(self, role: str) -> str:
        """The one line naming the gap."""
        return (
            f"{role}: {self.topic}[{self.partition}] starts at offset {self.log_start}, past "
            f"the expected offset {self.expected_offset}: {self.records_lost} records lost "
            "to retention or deletion before they were read"
        )


def report_gap(gap: Gap, role: str) -> None:
    """Log the gap's one warning line."""
    logger.warning(
        "%s",
        gap.line(role),
        extra={
            "topic": gap.topic,
            "partition": gap.partition,
            "expected_offset": gap.expected_offset,
            "log_start": gap.log_start,
            "records_lost": gap.records_lost,
        },
    )


def gaps_below(of: Callable[[str, int], int], wanted: dict[tuple[str, int], int]) -> list[Gap]:
    """The partitions whose wanted next offset is below their log start (``of``)."""
    found = []
    for (topic, partition), expected in sorted(wanted.items()):
        low = of(topic, partition)
        if low > max(0, expected):
            found.append(Gap(topic, partition, max(0, expected), low))
    return found


class LogStart:
    """The first offset each partition still holds, and its end (ListOffsets, one client)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._reader: PartitionReader | None = None
        self._lock = threading.Lock()

    def of(self, topic: str, partition: int) -> int:
        """The partition's log start now (0 when the broker says nothing)."""
        low, _ = self._watermarks(topic, partition)
        return max(0, low)

    def end(self, topic: str, partition: int) -> int:
        """The partition's end now: the offset its next record will get."""
        _, high = self._watermarks(topic, partition)
        return max(0, high)

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        with self._lock:
            if self._reader is None:
                group = self.settings.group(wire.LOG_START_ROLE)
                quick = self.settings.quick_connect()
                self._reader = PartitionReader(self.settings, group=group, **quick)
            return self._reader.watermarks((topic, partition), timeout=_WATERMARK_TIMEOUT_S)

    def gaps(self, wanted: dict[tuple[str, int], int]) -> list[Gap]:
        """The partitions whose wanted next offset is below their log start."""
        return gaps_below(self.of, wanted)

    def close(self) -> None:
        """Close the client."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

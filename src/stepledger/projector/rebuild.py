"""``stepledger rebuild``: build a fresh projection file from offset 0 of every partition.

It uses the same engine as the daemon (so the tables equal an incremental build) but
assigns partitions directly instead of joining a group, and stops once every partition
reported its end.  The file is built under a temporary name and moved into place whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from stepledger.config import Settings
from stepledger.deadletters.records import KafkaRecordLetters, MemoryRecordLetters, RecordLetterSink
from stepledger.errors import BrokerError, ConfigError, ViewStoreError
from stepledger.kafka import topic_partitions
from stepledger.kafka.gaps import Gap, LogStart, report_gap
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import BEGINNING, Consumed, Where, fatal_error
from stepledger.log import codec_for
from stepledger.projector.engine import (
    DEFAULT_CACHE_WORKFLOWS,
    BatchReport,
    Projector,
)
from stepledger.projector.gaps import gap_rows
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.snapshot import publish_snapshot
from stepledger.projector.store import ProjectionStore, stage

#: Called after each batch with (records read, records expected so far).
ProgressHook = Callable[[int, int], None]


@dataclass
class RebuildReport:
    """What a rebuild read and wrote."""

    records: int = 0
    projected: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    gaps: list[Gap] = field(default_factory=list)
    """Partitions whose head the log no longer holds: the rebuild starts at their log start."""

    def since(self) -> str:
        """How far back the rebuild could go, for its closing line ('' when to offset 0)."""
        if not self.gaps:
            return ""
        starts = ", ".join(f"{g.topic}[{g.partition}] from offset {g.log_start}" for g in self.gaps)
        lost = sum(g.records_lost for g in self.gaps)
        return f"; history before the log start is gone ({starts}: {lost} records)"

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def rebuild(
    settings: Settings,
    db_path: str | Path,
    *,
    topics: tuple[str, ...] = (),
    force: bool = False,
    republish_dead_letters: bool = False,
    batch_size: int = 10_000,
    cache_workflows: int = DEFAULT_CACHE_WORKFLOWS,
    group: str = "",
    progress: ProgressHook | None = None,
) -> RebuildReport:
    """Rebuild the projection file from offset 0 up to the current end of every partition."""
    target = Path(db_path)
    _check_target(target, force)
    partial = target.with_name(target.name + ".rebuilding")
    _remove_db(partial)
    sink: RecordLetterSink = (
        KafkaRecordLetters(settings) if republish_dead_letters else MemoryRecordLetters()
    )
    report = RebuildReport()
    began = time.monotonic()
    try:
        with ProjectionStore(partial) as store:
            projector = Projector(
                store,
                codec_for(settings),
                sink,
                group=group or settings.projector_group,
                cache_workflows=cache_workflows,
            )
            topics = topics or (settings.topic,)
            _read_all(settings, projector, topics, batch_size, report, progress)
    finally:
        sink.close()
    # Checked again: a projector may have started on the file while this one rebuilt.
    _check_target(target, force)
    _remove_db(target)
    os.replace(partial, target)
    with ProjectionStore(target) as store:
        publish_snapshot(store)
    report.seconds = time.monotonic() - began
    return report


def _check_target(target: Path, force: bool) -> None:
    if not target.exists():
        return
    if not force:
        raise ConfigError(f"{target} exists; pass --force to replace it with the rebuilt file")
    try:
        duckdb.connect(str(target), read_only=True).close()
    except duckdb.Error as exc:
        raise ViewStoreError(
            f"{target} is in use (is a projector writing it?): {str(exc).splitlines()[0]}"
        ) from exc


def _remove_db(path: Path) -> None:
    for leftover in (path, Path(str(path) + ".wal")):
        leftover.unlink(missing_ok=True)


def _read_all(
    settings: Settings,
    projector: Projector,
    topics: tuple[str, ...],
    batch_size: int,
    report: RebuildReport,
    progress: ProgressHook | None,
) -> None:
    every = {(t, p): projector for t in topics for p in topic_partitions(settings, t)}
    read_partitions(settings, every, batch_size, report, progress)


def read_partitions(
    settings: Settings,
    projectors: Mapping[Where, Projector],
    batch_size: int,
    report: RebuildReport,
    progress: ProgressHook | None,
) -> None:
    """Project each partition from offset 0 up to the end it reports, with its projector.

    One consumer reads every partition; each projector (one store) gets its own pipeline.
    """
    starts = dict.fromkeys(projectors, BEGINNING)
    group = next(iter(projectors.values())).group if projectors else settings.projector_group
    _record_gaps(settings, projectors, report, group)
    route: dict[Where, Pipeline] = {}
    made: dict[int, Pipeline] = {}
    for where, projector in projectors.items():
        if id(projector) not in made:
            made[id(projector)] = Pipeline(
                projector, on_commit=lambda b: _count(report, b), batch_size=batch_size
            )
        route[where] = made[id(projector)]
    try:
        with PartitionReader(
            settings,
            group=f"{group}-rebuild",
            fetch_wait_ms=50,
            grows=False,
            failure=fatal_error("consume"),
        ) as reader:
            _read_routed(reader, starts, route, batch_size, report, progress)
        for pipeline in made.values():
            pipeline.close()
        if progress is not None:
            progress(report.records, report.records)
    finally:
        for pipeline in made.values():
            pipeline.stop()


def _record_gaps(
    settings: Settings, projectors: Mapping[Where, Projector], report: RebuildReport, group: str
) -> None:
    """Gaps at the head: one line each, a row in the store's ``gaps`` table, the report."""
    log_start = LogStart(settings)
    try:
        gaps = log_start.gaps(dict.fromkeys(projectors, 0))
    finally:
        log_start.close()
    for gap in gaps:
        report_gap(gap, "rebuild")
        store = projectors[(gap.topic, gap.partition)].store
        store.write(stage({"gaps": gap_rows([gap], f"{group}-rebuild")}, {}), [])
    report.gaps.extend(gaps)


def _read_routed(
    reader: PartitionReader,
    starts: dict[Where, int],
    route: Mapping[Where, Pipeline],
    batch_size: int,
    report: RebuildReport,
    progress: ProgressHook | None,
) -> None:
    """Feed every partition's records to its pipeline until all are at their end at once."""
    expected = _expected(reader, starts, cached=False)
    at_end: set[Where] = set()

    def done() -> bool:
        return len(at_end) == len(starts)

    for batch in reader.follow(starts, stop=done, limit=batch_size, wait_s=0.5):
        batch.ends_now(at_end)
        for pipeline, records in _routed(batch.records, route):
            pipeline.feed(records)
        if progress is not None:
            expected = max(expected, _expected(reader, starts, cached=True))
            progress(report.records, max(expected, report.records))


def _routed(
    records: list[Consumed], route: Mapping[Where, Pipeline]
) -> list[tuple[Pipeline, list[Consumed]]]:
    """The records grouped by the pipeline of their partition, in log order within each."""
    grouped: dict[int, tuple[Pipeline, list[Consumed]]] = {}
    for record in records:
        pipeline = route[(record.topic, record.partition)]
        grouped.setdefault(id(pipeline), (pipeline, []))[1].append(record)
    return list(grouped.values())


def _count(report: RebuildReport, batch: BatchReport) -> None:
    report.records += batch.received
    report.projected += batch.projected
    report.duplicates += batch.duplicates
    report.dead_letters += sum(batch.dead_letters.values())


def _expected(reader: PartitionReader, starts: dict[Where, int], *, cached: bool) -> int:
    """Records in the partitions; a cached (fetch-reported) high watermark where possible.

    A fresh ListOffsets is wrong on the dev broker after batched produces, so this is only
    an estimate for the progress bar, never the end condition.
    """
    total = 0
    for where in starts:
        if cached:
            high = reader.high_watermark(where)
        else:
            try:
                _, high = reader.watermarks(where)
            except BrokerError:
                continue
        total += max(0, high or 0)
    return total

"""The projector's core: consumed records in, dead letters out, one DuckDB transaction per batch.

Shared by the daemon (consumer group) and ``rebuild`` (assigned partitions from offset 0),
so both build the tables the same way.  Order per batch: skip records below the stored
offset, decode (bad input becomes a dead letter), fold, publish the dead letters and wait
for their acknowledgements, then commit rows and offsets together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa

from stepledger import wire
from stepledger.codec import Codec
from stepledger.deadletters.letter import DeadLetter
from stepledger.deadletters.records import RecordLetterSink
from stepledger.domain.events import Event
from stepledger.errors import (
    CodecError,
    EventValidationError,
    ForeignFleetError,
    StepLedgerError,
    UnknownSchemaError,
    ViewStoreError,
)
from stepledger.kafka import Position
from stepledger.kafka.records import Consumed
from stepledger.projector.boundary import Offsets, ViewStore
from stepledger.projector.fold import BatchFold, WorkflowCache
from stepledger.projector.known import StoredWorkflows
from stepledger.projector.projection import WorkflowProjection
from stepledger.projector.rows import Coordinates
from stepledger.projector.store import stage

logger = logging.getLogger(__name__)

DEFAULT_CACHE_WORKFLOWS = 20_000
#: The group dead letters name when none is given (the default step log's projector group).
DEFAULT_GROUP = wire.derived_name(wire.STEP_LOG_TOPIC, wire.PROJECTOR_ROLE)
#: The dead-letter stage of an event that decodes but whose rows cannot be staged.
PROJECT_STAGE = "project"
#: The stage of an event that claims another fleet than its step log's.
FOREIGN_FLEET_STAGE = "fleet"
#: What turning rows into Arrow raises for a value its column cannot hold.
_STAGING_ERRORS = (pa.ArrowException, OverflowError, ValueError, TypeError)

Decoded = tuple[Event, Coordinates, bytes]


def _nothing() -> None:
    return None


@dataclass
class BatchReport:
    """What one batch did."""

    received: int = 0
    projected: int = 0
    duplicates: int = 0
    skipped: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    anomalies: int = 0
    oldest_at: datetime | None = None
    """Earliest ``occurred_at`` among the batch's events (for lag measurements)."""
    seconds: float = 0.0
    """From the start of preparing the batch to its commit."""
    lag_s: float | None = None
    """From the oldest event's ``occurred_at`` to the commit (clocks of two hosts)."""
    tokens: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Tokens of the model turns projected, by (fleet, model, incurred or reused)."""


def stage_of(error: StepLedgerError) -> str:
    """The dead-letter stage naming why a value was refused."""
    if isinstance(error, ForeignFleetError):
        return FOREIGN_FLEET_STAGE
    if isinstance(error, UnknownSchemaError):
        return "schema"
    if isinstance(error, EventValidationError):
        return "validate"
    return "decode"


@dataclass
class PreparedBatch:
    """A folded batch whose dead letters are durable; its rows wait to be committed."""

    report: BatchReport
    staged: dict[str, pa.Table]
    replaced: list[str]
    reached: Offsets
    touched: frozenset[str]


class Projector:
    """Projects batches of consumed records into the store, exactly once per record.

    ``prepare`` (decode, fold, dead letters) and ``commit`` (one DuckDB transaction) are
    separate so a writer thread can commit batches while the next is prepared; the fold
    cache then runs ahead of the store by the batches not committed yet (their workflows
    stay cached until they are).
    """

    def __init__(
        self,
        store: ViewStore,
        codec: Codec,
        dead_letters: RecordLetterSink,
        *,
        group: str = DEFAULT_GROUP,
        cache_workflows: int = DEFAULT_CACHE_WORKFLOWS,
    ) -> None:
        self.store = store
        self.codec = codec
        self.dead_letters = dead_letters
        self.group = group
        self.cache = WorkflowCache(cache_workflows)
        self.stored = StoredWorkflows()
        """Which workflows the store may hold (built at the first load, then kept up)."""
        self.committed: Offsets = store.offsets()
        self._folded: Offsets = dict(self.committed)

    def reload_offsets(self) -> Offsets:
        """Re-read the committed offsets (on assignment; no commit may be in flight)."""
        self.committed = self.store.offsets()
        self._folded = dict(self.committed)
        return dict(self.committed)

    def process(self, records: Sequence[Consumed]) -> BatchReport:
        """Project one batch: dead letters acknowledged first, then rows and offsets committed."""
        batch = self.prepare(records)
        try:
            self.commit(batch)
        except ViewStoreError:
            self.forget()
            raise
        self.cache.trim()
        return batch.report

    def forget(self) -> None:
        """Drop the fold states after a failed commit: they hold events the store lacks."""
        self.cache.clear()

    def prepare(
        self, records: Sequence[Consumed], settle: Callable[[], None] = _nothing
    ) -> PreparedBatch:
        """Skip what is projected, decode, fold, and make the dead letters durable.

        An event whose rows cannot be staged (a value past its column's type, however it
        got there) is dead-lettered like an undecodable one and the rest of the batch
        projects.  Finding it refolds the batch, so ``settle`` is called first: it must
        wait until any batch still being committed is in the store.
        """
        report = BatchReport(received=len(records))
        fresh, reached = self._fresh(records, report)
        decoded, letters = self._decode(fresh)
        try:
            fold = self._fold(decoded)
            staged = stage(fold.tables(), reached)
        except _STAGING_ERRORS:
            settle()
            decoded, refused = self._isolate(decoded, {at: record for record, at in fresh})
            letters.extend(refused)
            fold = self._fold(decoded)
            staged = stage(fold.tables(), reached)
        if letters:
            self.dead_letters.publish(letters)
            for letter in letters:
                report.dead_letters[letter.stage] = report.dead_letters.get(letter.stage, 0) + 1
        self._folded.update(reached)
        _summarise(report, fold)
        return PreparedBatch(
            report, staged, fold.replaced_workflows(), reached, frozenset(fold.touched)
        )

    def _isolate(
        self, decoded: list[Decoded], records: dict[Coordinates, Consumed]
    ) -> tuple[list[Decoded], list[DeadLetter]]:
        """Split a batch into the events whose rows stage and dead letters for the others.

        Each event is folded alone and the rows it changes are staged; one that fails is
        refused and its workflow refolded without it.  The fold states are dropped at the
        end, so the caller folds the kept events again from the store.
        """
        self.forget()
        kept: list[Decoded] = []
        refused: list[DeadLetter] = []
        for item in decoded:
            workflow_id = item[0].workflow_id
            self._load([workflow_id])
            trial = BatchFold()
            try:
                trial.add(self.cache.get(workflow_id), *item)
                stage(trial.tables(), {})
            except _STAGING_ERRORS as exc:
                error = f"its rows cannot be projected: {type(exc).__name__}: {exc}"
                refused.append(self._letter(records[item[1]], PROJECT_STAGE, error))
                self._refold(workflow_id, kept)
                continue
            kept.append(item)
        self.forget()
        return kept, refused

    def _refold(self, workflow_id: str, kept: list[Decoded]) -> None:
        """Rebuild one workflow's fold state from the store and the batch's kept events."""
        self.cache.discard([workflow_id])
        self._load([workflow_id])
        projection = self.cache.get(workflow_id)
        for event, _, _ in kept:
            if event.workflow_id == workflow_id and not projection.is_duplicate(event):
                projection.apply(event)

    def _fresh(
        self, records: Sequence[Consumed], report: BatchReport
    ) -> tuple[list[tuple[Consumed, Coordinates]], Offsets]:
        """The records not projected yet, and the next offset each partition reaches."""
        reached: Offsets = {}
        fresh: list[tuple[Consumed, Coordinates]] = []
        folded = self._folded
        for record in records:
            where = (record.topic, record.partition)
            offset = record.offset
            if offset < folded.get(where, 0) or offset < reached.get(where, 0):
                report.skipped += 1
                continue
            reached[where] = offset + 1
            fresh.append((record, (*where, offset)))
        return fresh, reached

    def _decode(
        self, fresh: list[tuple[Consumed, Coordinates]]
    ) -> tuple[list[tuple[Event, Coordinates, bytes]], list[DeadLetter]]:
        decoded: list[tuple[Event, Coordinates, bytes]] = []
        letters: list[DeadLetter] = []
        decode = self.codec.decode
        for record, at in fresh:
            value = record.value
            try:
                decoded.append((decode(value), at, value or b""))
            except StepLedgerError as exc:
                letters.append(self._letter(record, stage_of(exc), exc.message))
        return decoded, letters

    def commit(self, batch: PreparedBatch) -> None:
        """Write the batch's rows and offsets in one transaction (safe in a writer thread).

        On failure the caller must ``forget`` before preparing anything else.
        """
        if not batch.reached:
            return
        self.store.write(batch.staged, batch.replaced)
        self.committed.update(batch.reached)

    def _fold(self, decoded: list[tuple[Event, Coordinates, bytes]]) -> BatchFold:
        fold = BatchFold()
        self._load([event.workflow_id for event, _, _ in decoded])
        get = self.cache.get
        for event, at, value in decoded:
            fold.add(get(event.workflow_id), event, at, value)
        return fold

    def _load(self, workflow_ids: list[str]) -> None:
        """Bring missing workflows into the cache, replaying stored events of known ones."""
        missing = self.cache.missing(workflow_ids)
        if not missing:
            return
        stored = self.stored
        if not stored.built:
            stored.build(self.store.count("workflows"), self.store.each_workflow_id)
        # Most uncached workflows are new: only those the store may hold are asked about.
        maybe = stored.may_hold(missing)
        known = self.store.known_workflows(maybe) if maybe else set()
        stored.add(missing)
        for workflow_id in missing:
            self.cache.put(WorkflowProjection(workflow_id))
        if not known:
            return
        for workflow_id, value in self.store.history(sorted(known)):
            try:
                event = self.codec.decode(value)
            except CodecError as exc:
                raise ViewStoreError(
                    f"stored event of {workflow_id} no longer decodes: {exc.message}",
                    workflow_id=workflow_id,
                ) from exc
            projection = self.cache.get(workflow_id)
            if not projection.is_duplicate(event):
                projection.apply(event)

    def _letter(self, record: Consumed, stage: str, error: str) -> DeadLetter:
        origin = Position(record.topic, record.partition, record.offset)
        headers = record.headers
        logger.warning(
            "dead-lettering %s:%d@%d (%s): %s",
            origin.topic,
            origin.partition,
            origin.offset,
            stage,
            error,
            extra={"stage": stage, "topic": origin.topic, "offset": origin.offset},
        )
        return DeadLetter(record.key, record.value, headers, origin, stage, error, self.group)


def _summarise(report: BatchReport, fold: BatchFold) -> None:
    report.projected, report.duplicates = fold.projected, fold.duplicates
    report.anomalies = len(fold.anomalies)
    report.tokens = dict(fold.tokens)
    report.oldest_at = fold.oldest

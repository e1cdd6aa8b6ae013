"""The checkpointer: folds the step log into per-workflow checkpoints on a compacted topic.

A checkpointer owns a set of step-log partitions: those its consumer group assigns it
(:mod:`stepledger.checkpoints.member`, the daemon), or a fixed list for a one-shot catch-up.
Per partition it restores what the checkpoint topic holds (every workflow's newest
checkpoint and the partition's progress), then follows the step log from the record after
the progress, keeping each workflow's values; a partition revoked gets a last round and is
forgotten.  A workflow is checkpointed
after ``every_events`` new records, when it finishes, and every ``every_s`` seconds (a
*round*), which also writes the partition's progress: the offset up to which every workflow
that has a record there has a checkpoint covering it.  A reader uses the progress to prove
that an id with no checkpoint and no record after the log start is new.

After each round's checkpoints the partition's *directory* is written (where each
workflow's newest checkpoint sits, :mod:`stepledger.checkpoints.directory`), so a reader
finds one checkpoint without reading the partition; every record carries the offset of the
newest directory root.

Exactly once relative to the input, without transactions: a checkpoint is a function of
the step log up to its covered offset (the workflow's values in log order, byte for byte,
and the fold's summary of them), so writing it again, after a crash or by a second owner
of the partition, writes the same record; a reader takes the checkpoint with the highest
covered offset and reads the tail after it, deduplicating by event id.  Progress is written
only after every checkpoint it vouches for was acknowledged.  A group member writes only
for partitions its fence says it owns (:class:`~stepledger.kafka.fence.Fence`), so a member
paused past its session writes nothing once it wakes; what one writes anyway (a record in
flight) is an older, still true snapshot (see :mod:`stepledger.checkpoints.member`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.directory import Directory, DirectoryRecord
from stepledger.checkpoints.record import PROGRESS_KEY, WorkflowCheckpoint, encode
from stepledger.checkpoints.view import CheckpointView
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.state import replay
from stepledger.domain.steps import ENDED
from stepledger.errors import CodecError, OwnershipLostError
from stepledger.kafka import DurableProducer, Position, topic_partitions
from stepledger.kafka.fence import Fence
from stepledger.kafka.gaps import LogStart, report_gap
from stepledger.kafka.logid import LogIdentity, resolve
from stepledger.kafka.producer import Headers
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import Consumed, Where
from stepledger.log import codec_for

logger = logging.getLogger(__name__)

#: The event types after which a workflow runs nothing new: it is checkpointed at once.
_ENDINGS = tuple(
    f"{wire.CE_TYPE_PREFIX}{t}".encode() for t in ("workflow_finished", "workflow_dead_lettered")
)
#: A workflow whose checkpoint says one of these has ended: its values are let go.
_ENDED = frozenset(status.value for status in ENDED)
_POLL_S = 0.05


@dataclass
class _Workflow:
    values: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    covered: int = -1
    """The offset of the newest record in ``values``."""
    written: int = -1
    """The covered offset of the newest checkpoint acknowledged."""
    pending: int = 0
    evicted: bool = False
    """Ended and checkpointed: ``values`` were let go and are read back from the
    checkpoint if a record of the workflow arrives after all (a dead letter cleared)."""


@dataclass
class _Partition:
    number: int
    broken: bool = False
    """Records it never read were deleted: nothing more is vouched for (see ``_gap``)."""
    progress: int = -1
    read_to: int = -1
    """The offset of the newest step-log record taken in."""
    workflows: dict[bytes, _Workflow] = field(default_factory=dict)
    directory: Directory = field(default_factory=Directory)
    """Where each workflow's newest checkpoint sits in the checkpoint topic."""


@dataclass(frozen=True)
class CheckpointOptions:
    """When workflows are checkpointed."""

    every_events: int = 100
    """A workflow is checkpointed after this many new records."""
    every_s: float = 5.0
    """Every workflow with new records, and each partition's progress, at this interval."""


class Checkpointer:
    """Writes workflow checkpoints for the step-log partitions it owns."""

    def __init__(
        self,
        settings: Settings,
        partitions: Iterable[int] | None = None,
        options: CheckpointOptions | None = None,
        codec: Codec | None = None,
        identity: LogIdentity | None = None,
    ) -> None:
        self.settings = settings
        self._identity = identity
        self.options = options or CheckpointOptions()
        self.codec = codec or codec_for(settings)
        self._wanted = None if partitions is None else sorted(set(partitions))
        self._parts: dict[int, _Partition] = {}
        self._producer = DurableProducer(settings)
        self._log_start = LogStart(settings)
        self._points = self._view()
        """Reads evicted workflows' checkpoints back (see ``_read_back``)."""
        self.written = 0
        """Checkpoints (workflow and progress records) acknowledged so far."""
        self.fence: Fence | None = None
        """A group member's: nothing is written for a partition it does not own."""

    def restore(self, numbers: Iterable[int] | None = None) -> dict[Where, int]:
        """Load what the checkpoint topic holds for ``numbers`` (default: the fixed list, or
        every partition), replacing what was held of them; where each is read from next."""
        if numbers is None:
            numbers = self._wanted or topic_partitions(self.settings, self.settings.topic)
        view = self._view()
        restored = []
        for number in numbers:
            part = _Partition(number)
            for key, found in view.partition(number).items():
                if key == PROGRESS_KEY:
                    part.progress = part.read_to = found.covered_offset
                    continue
                covered = found.covered_offset
                if found.status in _ENDED:
                    part.workflows[key] = _Workflow([], [], covered, covered, evicted=True)
                    continue
                offsets = list(found.offsets) or [-1] * len(found.events)
                part.workflows[key] = _Workflow(list(found.events), offsets, covered, covered)
            for key, offset in view.offsets(number).items():
                if key in part.workflows:
                    part.directory.put(key, offset)
            self._parts[number] = part
            self._check_start(part, part.progress + 1)
            restored.append(part)
        logger.info(
            "checkpointer restored %s",
            ", ".join(f"[{p.number}] {len(p.workflows)} workflows@{p.progress}" for p in restored),
        )
        return {(self.settings.topic, p.number): p.progress + 1 for p in restored}

    def release(self, numbers: Iterable[int]) -> None:
        """Partitions revoked: a last round for each (while still ours), then forgotten."""
        for number in numbers:
            part = self._parts.pop(number, None)
            if part is not None:
                self._round_of(part)

    def drop(self, numbers: Iterable[int]) -> None:
        """Partitions lost (taken while this member was away): forgotten, nothing written."""
        for number in numbers:
            self._parts.pop(number, None)

    @property
    def partitions(self) -> list[int]:
        """The step-log partitions held now."""
        return sorted(self._parts)

    @property
    def identity(self) -> LogIdentity:
        """The step log checkpointed: every record written names it, only its are read."""
        if self._identity is None:
            self._identity = resolve(self.settings)
        return self._identity

    def _view(self) -> CheckpointView:
        # The identity is asked for when a record is first read, not here (no I/O yet).
        return CheckpointView(self.settings, identity=self._identity, log_ends=self._log_start)

    def _check_start(self, part: _Partition, expected: int) -> None:
        """Stop vouching for a partition whose records past ``expected`` were deleted unread.

        Progress promises that every workflow with a record up to it has a checkpoint; a
        record the checkpointer never read breaks that promise for good, so the partition's
        progress stays where it was (readers refuse what it cannot prove) and its
        checkpoints are no longer extended (one could otherwise miss records in the middle).
        """
        for gap in self._log_start.gaps({(self.settings.topic, part.number): expected}):
            report_gap(gap, "checkpointer")
            logger.error(
                "checkpointer: %s[%d] is no longer checkpointed: its history before offset %d "
                "expired unread; workflows with records there raise HistoryExpiredError",
                gap.topic,
                gap.partition,
                gap.log_start,
            )
            part.broken = True

    def catch_up(self, timeout_s: float = 120.0) -> None:
        """Read every owned partition to its end, then write a round (tests, one-shot runs)."""
        if not self._parts:
            self.restore()
        with self._reader() as reader:
            for records in reader.to_end(self._starts(), within=timeout_s, wait_s=_POLL_S):
                for record in records:
                    self.take(record)
        self.round()

    def unready(self) -> str | None:
        """Why the checkpointer is not ready: a partition with workflows but no directory root
        written yet (its readers would scan it), or one whose records were deleted unread."""
        for number, part in sorted(self._parts.items()):
            if part.broken:
                return f"step-log partition {number} lost records before they were checkpointed"
            if part.directory.root < 0 and (part.workflows or part.directory.offsets):
                return f"no checkpoint directory written yet for step-log partition {number}"
        return None

    def round(self) -> None:
        """Checkpoint every workflow with new records, then each partition's directory and
        progress (both vouch only for checkpoints already acknowledged)."""
        for part in list(self._parts.values()):
            self._round_of(part)

    def _round_of(self, part: _Partition) -> None:
        if part.broken:
            return
        try:
            self._flush(part, [k for k, w in part.workflows.items() if w.covered > w.written])
            if part.directory.due():
                self._write_directory(part)
            if part.read_to > part.progress:
                progress = WorkflowCheckpoint(None, self.settings.topic, part.number, part.read_to)
                self._send(part, [(progress.key, encode(progress))])
                part.progress = part.read_to
        except OwnershipLostError as exc:
            logger.warning(
                "checkpointer: round of step-log partition %d not written: %s", part.number, exc
            )

    def _write_directory(self, part: _Partition) -> None:
        """The chunks whose entries changed, then the root over them."""
        topic, number, progress = self.settings.topic, part.number, part.read_to
        chunks = part.directory.chunks_due(topic, number, progress)
        at = self._send(part, [(c.key, dirs.encode(c)) for c in chunks])
        buckets = chunks[0].buckets if chunks else part.directory.buckets
        part.directory.written({c.bucket: o for c, o in zip(chunks, at, strict=True)}, buckets)
        root: DirectoryRecord = part.directory.root_record(topic, number, progress)
        (part.directory.root,) = self._send(part, [(root.key, dirs.encode(root))])

    def close(self) -> None:
        """Flush the producer."""
        self._producer.close()
        self._log_start.close()

    def _reader(self) -> PartitionReader:
        group = self.settings.group(wire.CHECKPOINTER_ROLE)
        return PartitionReader(self.settings, group=group, fetch_wait_ms=50, grows=False)

    def _starts(self) -> dict[Where, int]:
        topic = self.settings.topic
        return {(topic, p.number): p.progress + 1 for p in self._parts.values() if not p.broken}

    def take(self, record: Consumed) -> None:
        """Take in one step-log record of a partition held (a partition not held: ignored)."""
        part = self._parts.get(record.partition)
        if part is None:
            return  # revoked while its records were in flight
        offset = record.offset
        if offset > part.read_to + 1:
            # Offsets of an idempotent, non-transactional log are contiguous: a jump is a
            # deletion ahead of this reader (it lagged by more than the retention).
            self._check_start(part, part.read_to + 1)
        if part.broken:
            return
        key = record.key or b""
        held = part.workflows.setdefault(key, _Workflow())
        part.read_to = max(part.read_to, offset)
        if offset <= held.covered:
            return  # already in its restored checkpoint
        if held.evicted:
            self._read_back(part, key, held)
            if part.broken:
                return
        held.values.append(record.value or b"")
        held.offsets.append(offset)
        held.covered = offset
        held.pending += 1
        if held.pending >= self.options.every_events or _ends(record):
            # Not owned now: written by a round once the group answered, or by the next owner.
            with contextlib.suppress(OwnershipLostError):
                self._flush(part, [key])

    def _flush(self, part: _Partition, keys: list[bytes]) -> None:
        checkpoints = [self._checkpoint(part.number, key, part.workflows[key]) for key in keys]
        at = self._send(part, [(c.key, encode(c)) for c in checkpoints])
        for key, offset, checkpoint in zip(keys, at, checkpoints, strict=True):
            held = part.workflows[key]
            held.written, held.pending = held.covered, 0
            part.directory.put(key, offset)
            if checkpoint.status in _ENDED:
                # Its values live on in the checkpoint just acknowledged: memory follows
                # the running workflows, not every workflow the partition ever held.
                held.values, held.offsets, held.evicted = [], [], True

    def _read_back(self, part: _Partition, key: bytes, held: _Workflow) -> None:
        """Take an evicted workflow's values back from its newest checkpoint."""
        workflow_id = key.decode("utf-8", "replace")
        at = part.directory.offsets.get(key)
        found = None if at is None else self._points.at(part.number, at, key)
        if found is None:  # not where this checkpointer wrote it: whatever is newest
            found = self._points.lookup(part.number, workflow_id).checkpoint
        if found is None:
            # Extending it from nothing would write a checkpoint that forgets its history:
            # as for records deleted unread, the partition's progress stays where it was
            # (readers refuse what it cannot prove) until a restart restores the partition.
            logger.error(
                "checkpointer: %s[%d] is no longer checkpointed: the checkpoint of %r "
                "could not be read back",
                self.settings.checkpoint_topic,
                part.number,
                workflow_id,
            )
            part.broken = True
            return
        held.values = list(found.events)
        held.offsets = list(found.offsets) or [-1] * len(found.events)
        held.evicted = False

    @property
    def held_bytes(self) -> int:
        """Bytes of step-log values held in memory (running workflows' only)."""
        return sum(
            len(value)
            for part in self._parts.values()
            for held in part.workflows.values()
            for value in held.values
        )

    def _checkpoint(self, partition: int, key: bytes, held: _Workflow) -> WorkflowCheckpoint:
        workflow_id = key.decode("utf-8", "replace")
        events = []
        for value in held.values:
            try:
                events.append(self.codec.decode(value))
            except CodecError:
                continue  # kept as bytes; every reader skips it as the fold does
        state = replay(workflow_id, events)
        return WorkflowCheckpoint(
            workflow_id,
            self.settings.topic,
            partition,
            held.covered,
            status=state.status.value,
            attempt=state.attempt,
            steps=len(state.steps),
            events=tuple(held.values),
            offsets=tuple(held.offsets),
        )

    def _send(self, part: _Partition, records: list[tuple[bytes, bytes]]) -> list[int]:
        """Write records to the partition's checkpoint partition; their offsets once acked.

        Each names the step log (``stepledger_log``) and carries the offset of the newest
        directory root (the header readers start from); a record sent before any root
        carries no root.
        """
        fence = self.fence
        if fence is not None and not fence.owns(part.number):
            raise OwnershipLostError(
                f"step-log partition {part.number} may have moved to another checkpointer"
            )
        topic = self.settings.checkpoint_topic
        root = part.directory.root
        pointer = [(wire.CHECKPOINT_DIRECTORY_HEADER, str(root).encode())] if root >= 0 else []
        headers: Headers = [*pointer, self.identity.header]
        # The checkpoint's partition is the step log's, whatever the key hashes to.
        futures: list[Future[Position]] = [
            self._producer.send(topic, key, value, headers, partition=part.number)
            for key, value in records
        ]
        offsets = [self._producer.wait(future).offset for future in futures]
        self.written += len(futures)
        return offsets


def _ends(record: Consumed) -> bool:
    return any(n == wire.CE_TYPE_HEADER and v in _ENDINGS for n, v in record.headers)

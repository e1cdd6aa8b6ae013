"""The simulated broker: one topic's partitions in memory, and each actor's clients of it.

A :class:`Broker` holds every record ever appended (offset, key, value bytes, headers, the
broker's time, the event and which actor wrote it); retention moves a partition's start up
and readers see only what is at or past it.  Records are keyed by workflow id, so one
workflow's events are ordered in one partition.

Each actor talks to it through its own clients, every call a crossing of the scheduler:

- :class:`LogClient` is the :class:`~stepledger.log.EventLog` an SDK or daemon appends
  through.  Acknowledgement faults are taken here: ``lost`` (the record is durable but the
  caller gets a DurabilityError), ``refused`` (nothing is written, an error), ``late``
  (durable, the acknowledgement comes after a pause while others run).
- :class:`SimReader` is the :class:`~stepledger.history.protocol.WorkflowHistory` a resume
  and the human queue read through: the workflow's partition from its start, undecodable
  records skipped as the Kafka reader skips them, a history whose head retention deleted
  completed from its checkpoint (the real ``HistoryGuard``).

Values are the real codec's bytes, so a record from a foreign writer (bytes that are no
event of ours) reaches every reader as it would on Kafka.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.errors import CodecError, DurabilityError
from stepledger.history.clock import LOG_APPEND_TIME, AppendClock, Stamp
from stepledger.history.protocol import History, Until
from stepledger.kafka import Position
from stepledger.kafka.records import Consumed
from stepledger.log import Acknowledgement, event_headers
from stepledger_dev.simulate.scheduler import EPOCH, Actor, Scheduler

#: How often a reader following a workflow looks again (simulated seconds).
FOLLOW_POLL_S = 0.05


@dataclass(eq=False)
class Record:
    """One record as the broker stores it, with what the simulator knows about it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    broker_ms: int
    event: Event | None
    """The event it holds (None: a foreign writer's bytes)."""
    writer: str
    """The actor that appended it (``broker`` for faults)."""
    duplicate: bool = False
    """A second delivery of an earlier record (a produce retried without idempotence)."""

    def consumed(self) -> Consumed:
        """The record as a consumer hands it over."""
        return Consumed(
            self.topic,
            self.partition,
            self.offset,
            self.key,
            self.value,
            list(self.headers),
            (LOG_APPEND_TIME, self.broker_ms + _EPOCH_MS),
        )


#: Milliseconds from the Unix epoch to the scheduler's EPOCH.
_EPOCH_MS = int(EPOCH.timestamp() * 1000)


@dataclass
class Partition:
    """One partition: every record appended, and where the log starts now."""

    records: list[Record] = field(default_factory=list)
    start: int = 0
    """The first offset still held (retention deleted everything below it)."""

    @property
    def end(self) -> int:
        """The offset the next record gets."""
        return len(self.records)

    def visible(self, after: int = -1) -> list[Record]:
        """The records still held, past ``after``."""
        return self.records[max(self.start, after + 1) :]


class Broker:
    """One step-log topic in memory; ``on_append`` is told about every record appended."""

    def __init__(self, topic: str, partitions: int, sched: Scheduler) -> None:
        self.topic = topic
        self.partitions = [Partition() for _ in range(partitions)]
        self.sched = sched
        self.codec = Codec()
        self.on_append: list[Callable[[Record], None]] = []

    def partition_of(self, key: str) -> int:
        """The partition a key lands in (stable across runs)."""
        return zlib.crc32(key.encode()) % len(self.partitions)

    def append(self, event: Event, writer: str) -> Record:
        """Store one event at the end of its workflow's partition."""
        value = self.codec.encode(event)
        headers = [(k, v or b"") for k, v in event_headers(event)]
        key = event.workflow_id.encode()
        return self.put(key, value, headers, event, writer)

    def put(
        self,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        event: Event | None,
        writer: str,
        *,
        duplicate: bool = False,
    ) -> Record:
        """Store raw bytes (a foreign writer's, or a duplicate delivery) at a partition's end."""
        number = self.partition_of((key or b"").decode(errors="replace"))
        part = self.partitions[number]
        record = Record(
            self.topic,
            number,
            part.end,
            key,
            value,
            headers,
            self.sched.now_ms,
            event,
            writer,
            duplicate,
        )
        part.records.append(record)
        for listener in self.on_append:
            listener(record)
        return record

    def workflow_records(self, workflow_id: str, *, whole: bool = False) -> list[Record]:
        """A workflow's records still held (``whole``: every one ever appended)."""
        part = self.partitions[self.partition_of(workflow_id)]
        records = part.records if whole else part.visible()
        key = workflow_id.encode()
        return [r for r in records if r.key == key]

    def decode(self, record: Record) -> Event | None:
        """The event a record holds, or None for bytes that are no event (skipped)."""
        if record.event is not None:
            return record.event
        try:
            return self.codec.decode(record.value)
        except CodecError:
            return None


class AckFaults:
    """Acknowledgement faults waiting for an actor's next append: ``lost``, ``refused``,
    ``late``."""

    def __init__(self) -> None:
        self.pending: dict[str, list[str]] = {}

    def add(self, actor: str, kind: str) -> None:
        """Arm a fault for the actor's next append."""
        self.pending.setdefault(actor, []).append(kind)

    def take(self, actor: str) -> str | None:
        """The fault armed for this actor's append, if any."""
        queue = self.pending.get(actor)
        return queue.pop(0) if queue else None


class LogClient:
    """One actor's event log: every append a crossing, acknowledgement faults applied."""

    def __init__(self, broker: Broker, actor: Actor, faults: AckFaults) -> None:
        self.broker = broker
        self.actor = actor
        self.faults = faults

    def append(self, event: Event) -> Position:
        """Append and wait for the acknowledgement (or the fault armed for it)."""
        return self.send(event)()

    async def append_async(self, event: Event) -> Position:
        """Not used by the simulation (its actors are synchronous)."""
        return self.append(event)

    def connect(self) -> None:
        """Nothing to connect: the simulated broker is in the process."""

    def send(self, event: Event) -> Acknowledgement:
        """Append now; the wait returned gives the acknowledgement or its fault."""
        sched = self.broker.sched
        sched.point(self.actor)
        fault = self.faults.take(self.actor.name)
        if fault == "refused":
            return _raise(DurabilityError(f"simulated: {event.type} not written (refused)"))
        record = self.broker.append(event, self.actor.name)
        if event.type == "step_intended":
            self.actor.intents += 1
        elif event.type == "step_outcome":
            self.actor.outcomes += 1
        position = Position(record.topic, record.partition, record.offset)
        if fault == "lost":
            return _raise(DurabilityError(f"simulated: {event.type} written but its ack was lost"))
        if fault == "late":
            actor = self.actor

            def late() -> Position:
                sched.sleep(actor, 0.3)
                return position

            return late
        return lambda: position

    def close(self) -> None:
        """Nothing to release."""


def _raise(exc: DurabilityError) -> Acknowledgement:
    def wait() -> Position:
        raise exc

    return wait


class Completion(Protocol):
    """Completes a tail whose head retention deleted (a ``HistoryGuard``)."""

    def complete(
        self, workflow_id: str, partition: int, tail: list[Event], read_from: int = 0
    ) -> list[Event]: ...


class SimReader:
    """One actor's workflow history over the broker (every read a crossing).

    Its opens read first (:meth:`known` answers None).  ``history`` completes a workflow
    whose partition's head was deleted from the checkpoints, as the Kafka history does;
    ``check`` is shown every history read.
    """

    def __init__(
        self,
        broker: Broker,
        actor: Actor,
        history: Completion | None = None,
        check: Callable[[str, list[Event], str], None] | None = None,
    ) -> None:
        self.broker = broker
        self.actor = actor
        self.history = history
        self.check = check
        self.appends = AppendClock()
        """The actor's lead over the broker, as the Kafka history learns it."""

    def read(self, workflow_id: str, *, through: Position | None = None) -> History:
        """The workflow's history: its events still held, completed from its checkpoint
        (a read always reaches the partition's end, so ``through`` changes nothing)."""
        sched = self.broker.sched
        sched.point(self.actor)
        events, stamps = self._events(self.broker.workflow_records(workflow_id))
        # Read at this crossing, on the actor's clock (no crossing more: replays stay).
        now = EPOCH + timedelta(milliseconds=sched.now_ms + self.actor.skew_ms)
        appended = self.appends.read(stamps, now)
        if self.history is not None:
            partition = self.broker.partition_of(workflow_id)
            events = self.history.complete(workflow_id, partition, events)
        if self.check is not None:
            self.check(workflow_id, events, self.actor.name)
        return History(events, whole=self.history is not None, appended=appended)

    def known(self, workflow_id: str) -> History | None:
        """None: nothing is kept between reads (an open reads first)."""
        return None

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Nothing to note: nothing is kept."""

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after``, up to the first one ``until`` accepts."""
        sched = self.broker.sched
        sched.point(self.actor)
        ends = sched.now_ms + int(timeout_s * 1000)
        index = -1 if after is None else after.offset
        found: list[Event] = []
        key = workflow_id.encode()
        part = self.broker.partitions[self.broker.partition_of(workflow_id)]
        while True:
            for record in part.visible(index):
                index = record.offset
                event = self.broker.decode(record) if record.key == key else None
                if event is None:
                    continue
                found.append(event)
                if until(event):
                    return found
            if sched.now_ms >= ends:
                return found
            sched.sleep(self.actor, min(FOLLOW_POLL_S, (ends - sched.now_ms) / 1000))

    def _events(self, records: list[Record]) -> tuple[list[Event], list[tuple[str, Stamp]]]:
        """The records' events, and each one's id with its record's stamp."""
        events, stamps = [], []
        for record in records:
            event = self.broker.decode(record)
            if event is not None:
                events.append(event)
                stamps.append((event.event_id, (LOG_APPEND_TIME, record.broker_ms + _EPOCH_MS)))
        return events, stamps

    def close(self) -> None:
        """Nothing to release."""

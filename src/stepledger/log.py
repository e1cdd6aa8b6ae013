"""The event-log boundary: a Protocol, its Kafka implementation and an in-memory one for tests."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Protocol, get_args

from stepledger import tracing, wire
from stepledger.codec import Codec, RegistryFraming
from stepledger.config import Settings
from stepledger.domain.events import Event, EventType
from stepledger.errors import DurabilityError
from stepledger.kafka import DurableProducer, Headers, Position

#: Blocks until the event sent is acknowledged and returns where it landed (or raises).
Acknowledgement = Callable[[], Position]


class EventLog(Protocol):
    """Appends events durably: a call returns only once its own event is acknowledged."""

    def append(self, event: Event) -> Position:
        """Append one event and wait for its acknowledgement.

        Returns where it landed: one offset per record of its partition, whoever wrote it,
        in log order (a runner whose records landed at consecutive offsets takes that as
        proof that nothing came between them; see ``Workflow.read_claim``).
        """
        ...

    async def append_async(self, event: Event) -> Position:
        """Append one event and await its acknowledgement."""
        ...

    def send(self, event: Event) -> Acknowledgement:
        """Queue one event and return the wait for its acknowledgement, without waiting.

        Events of one workflow sent one after another land in that order (one partition,
        an idempotent producer), so a caller may send several and then wait for them all.
        """
        ...

    def connect(self) -> None:
        """Start connecting (returns at once), e.g. while the log is read before an append;
        a log that needs no connection does nothing."""
        ...

    def close(self) -> None:
        """Release the log's resources."""
        ...


def event_headers(event: Event) -> Headers:
    """CloudEvents binary-mode headers, so consumers can route without decoding."""
    return [
        (wire.CE_SPECVERSION_HEADER, _CE_SPECVERSION),
        (wire.CE_TYPE_HEADER, _CE_TYPE[event.type]),
        (wire.CE_ID_HEADER, event.event_id.encode()),
        (wire.CE_SOURCE_HEADER, _ce_source(event.fleet_id, event.producer_id)),
        *tracing.trace_headers(),
    ]


_CE_SPECVERSION = wire.CE_SPECVERSION.encode()
_CE_TYPE = {t: f"{wire.CE_TYPE_PREFIX}{t}".encode() for t in get_args(EventType)}


@functools.lru_cache(maxsize=64)
def _ce_source(fleet_id: str, producer_id: str) -> bytes:
    return f"{wire.CE_SOURCE_PREFIX}{fleet_id}/{producer_id}".encode()


def codec_for(settings: Settings) -> Codec:
    """The codec the settings ask for: registry framing when a registry URL is set; pinned
    to the fleet when the settings are a fleet role's (``fleet create`` wrote them), so the
    fleet's daemons and agents refuse a record that claims another fleet."""
    fleet = settings.fleet_id if settings.role is not None else None
    if settings.schema_registry_url:
        subject = f"{settings.topic}-value"
        registry = RegistryFraming(settings.schema_registry_url, subject)
        return Codec(registry=registry, fleet=fleet)
    return Codec(fleet=fleet)


class AckJournal:
    """Appends the id of each acknowledged event to a file, so a harness can prove none was lost.

    Each line is written and flushed before the append returns: a process killed right after
    survives in the OS page cache (a machine crash is out of scope).
    """

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the log
        self._lock = threading.Lock()

    def record(self, event_id: str) -> None:
        """Append one acknowledged event id."""
        with self._lock:
            self._file.write(event_id + "\n")
            self._file.flush()


class KafkaEventLog:
    """The event log on a Kafka topic, keyed by workflow id so each workflow stays ordered."""

    def __init__(
        self,
        settings: Settings,
        *,
        codec: Codec | None = None,
        producer: DurableProducer | None = None,
    ) -> None:
        self.settings = settings
        self._codec = codec
        self._producer = producer or DurableProducer(settings)
        self._journal = AckJournal(settings.ack_journal) if settings.ack_journal else None

    @property
    def codec(self) -> Codec:
        """The codec, built on first use (it may talk to a schema registry)."""
        if self._codec is None:
            self._codec = codec_for(self.settings)
        return self._codec

    @property
    def producer(self) -> DurableProducer:
        """The durable producer every record of this process leaves through."""
        return self._producer

    def append(self, event: Event) -> Position:
        """Append one event and wait for its own acknowledgement."""
        key, value = event.workflow_id.encode(), self.codec.encode(event)
        position = self._producer.append(self.settings.topic, key, value, event_headers(event))
        if self._journal is not None:
            self._journal.record(event.event_id)
        return position

    def send(self, event: Event) -> Acknowledgement:
        """Queue one event; the returned wait blocks until its acknowledgement.

        Its report is served by the producer's delivery thread: ``send`` is for many
        threads sending at once (the recovery daemon's workers), which would otherwise
        take turns at polling the producer.
        """
        key, value = event.workflow_id.encode(), self.codec.encode(event)
        wait = self._producer.queue(self.settings.topic, key, value, event_headers(event))
        journal = self._journal
        if journal is None:
            return wait

        def acknowledged() -> Position:
            position = wait()
            journal.record(event.event_id)
            return position

        return acknowledged

    async def append_async(self, event: Event) -> Position:
        """Append one event and await its own acknowledgement."""
        key, value = event.workflow_id.encode(), self.codec.encode(event)
        # The future fails with DurabilityError past the durable timeout (+2 s) by itself.
        position = await self._producer.send_async(
            self.settings.topic, key, value, event_headers(event)
        )
        if self._journal is not None:
            self._journal.record(event.event_id)
        return position

    def connect(self) -> None:
        """Start connecting the producer (returns at once), e.g. while reading the log."""
        self._producer.connect()

    def close(self) -> None:
        """Flush and close the producer."""
        self._producer.close()


class InMemoryEventLog:
    """An event log in memory, for users' unit tests; ``fail`` simulates an unreachable broker."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.fail = False
        self._lock = threading.Lock()

    def append(self, event: Event) -> Position:
        """Append one event (or raise DurabilityError when ``fail`` is set)."""
        if self.fail:
            raise DurabilityError("in-memory log set to fail")
        with self._lock:
            self.events.append(event)
            return Position("memory", 0, len(self.events) - 1)

    async def append_async(self, event: Event) -> Position:
        """Append one event."""
        return self.append(event)

    def send(self, event: Event) -> Acknowledgement:
        """Append one event now (an in-memory log acknowledges at once)."""
        position = self.append(event)
        return lambda: position

    def workflow_events(self, workflow_id: str) -> list[Event]:
        """The events of one workflow in log order."""
        return [e for e in self.events if e.workflow_id == workflow_id]

    def connect(self) -> None:
        """Nothing to connect."""

    def close(self) -> None:
        """Nothing to release."""

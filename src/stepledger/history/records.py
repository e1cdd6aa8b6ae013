"""The Kafka history's reads of a workflow's records: a scan to the partitions' ends, a
follow after a position, and the decoding of what the index kept (with each record's stamp
where a caller asks: :mod:`stepledger.history.clock`)."""

from __future__ import annotations

import logging

from stepledger import wire
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.errors import BrokerError, StepLedgerError
from stepledger.history.clock import Stamp
from stepledger.history.index import Stored
from stepledger.history.protocol import Until
from stepledger.kafka import Position
from stepledger.kafka.reader import PartitionReader, records_to_end

logger = logging.getLogger(__name__)

Starts = dict[tuple[str, int], int]
Stamps = list[tuple[str, Stamp]]
"""The event ids a read decoded from the log, with their records' stamps."""

#: Where a scan starts: offset 0, not the logical "beginning" (a ListOffsets round); an
#: offset removed by retention is reset to the earliest one (``auto.offset.reset``).
FIRST_OFFSET = 0
#: A read never waits longer than this to reach the end of the partitions it reads.
READ_LIMIT_S = 120.0


def where_of(position: Position) -> tuple[str, int]:
    return (position.topic, position.partition)


def read_to_end(
    settings: Settings,
    codec: Codec,
    starts: Starts,
    workflow_id: str,
    stamps: Stamps | None = None,
) -> tuple[list[Event], int]:
    """One workflow's events from the given offsets up to each partition's end, and how
    many records were read (each event's stamp added to ``stamps`` when given)."""
    key = workflow_id.encode()
    found: list[Event] = []
    scanned = 0
    group = settings.group(wire.WORKFLOW_READER_ROLE)
    for records in records_to_end(settings, starts, group=group, within=READ_LIMIT_S):
        scanned += len(records)
        for record in records:
            decoded = record.key == key and _decode_value(found, record.value or b"", codec)
            if decoded and stamps is not None:
                stamps.append((found[-1].event_id, record.timestamp))
    return found, scanned


def follow_partition(
    settings: Settings,
    codec: Codec,
    workflow_id: str,
    after: Position | None,
    until: Until,
    timeout_s: float,
) -> list[Event]:
    """The workflow's events after a position in its partition, up to an accepted one."""
    if after is None:
        raise BrokerError("following a workflow needs a position it wrote", retryable=False)
    key = workflow_id.encode()
    found: list[Event] = []
    starts = {where_of(after): after.offset + 1}
    with PartitionReader(settings, group=settings.group(wire.WORKFLOW_READER_ROLE)) as reader:
        for batch in reader.follow(starts, within=timeout_s):
            for record in batch.records:
                if record.key != key:
                    continue
                _decode_value(found, record.value or b"", codec)
                if found and until(found[-1]):
                    return found
    return found


def decoded(values: list[bytes], codec: Codec) -> list[Event]:
    """The events of record values (an undecodable one skipped, with a warning)."""
    events: list[Event] = []
    for value in values:
        _decode_value(events, value, codec)
    return events


def decoded_stored(stored: list[Stored], codec: Codec, stamps: Stamps) -> list[Event]:
    """The events of records the index kept (each event's stamp added to ``stamps``)."""
    events: list[Event] = []
    for value, stamp in stored:
        if _decode_value(events, value, codec):
            stamps.append((events[-1].event_id, stamp))
    return events


def _decode_value(found: list[Event], value: bytes, codec: Codec) -> bool:
    """Add the record's event to ``found`` (False: undecodable, skipped)."""
    try:
        found.append(codec.decode(value))
    except StepLedgerError as exc:
        # The projector dead-letters such a record; a resume can only go on without it.
        logger.warning("skipped an undecodable record of the workflow: %s", exc)
        return False
    return True

"""What a consumer hands the rest of the library: its own record type and one poll's answer.

Nothing above :mod:`stepledger.kafka` sees a client message: a record is a
:class:`Consumed`, a partition a :data:`Where` (topic, partition number), a poll a
:class:`Polled` (records, the partitions that reported their end, and where), errors
:class:`~stepledger.errors.BrokerError`.  :func:`polled` is the one place a batch of client
messages is sorted into those, for the group consumer and the partition reader alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, Message

from stepledger.errors import BrokerError
from stepledger.kafka.broker import Refusals
from stepledger.kafka.producer import Headers

logger = logging.getLogger(__name__)

Where = tuple[str, int]
"""A partition: (topic, partition number)."""
BEGINNING: int = OFFSET_BEGINNING
"""The logical offset of a partition's first record still held (a start offset)."""
END: int = OFFSET_END
"""The logical offset after a partition's last record (a start offset: only new records)."""

#: Errors that say a start offset is outside the partition (``auto.offset.reset=error``).
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class Consumed:
    """One record as it was read, not decoded: where it sits, its bytes, headers and stamp.

    The library's own record type: whatever reads a topic above this package (the
    projector's engine, the recovery daemon, the readers, a rebuild) is handed these,
    never the client's messages.  Nothing changes one once read.  A record the client
    handed over reads its headers and stamp from the client's message when first asked
    for: the client builds a message's headers anew on every call, at more than the cost of
    the rest of the record, and most readers never look (a scan for one workflow, the
    projector but for a dead letter).
    """

    __slots__ = (
        "_headers",
        "_message",
        "_timestamp",
        "key",
        "offset",
        "partition",
        "topic",
        "value",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timestamp: tuple[int, int] = (0, -1),
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self._headers: Headers | None = [] if headers is None else headers
        self._timestamp: tuple[int, int] | None = timestamp
        self._message: Message | None = None

    @property
    def headers(self) -> Headers:
        """The headers as they were produced (a header without a value stays None)."""
        headers = self._headers
        if headers is None:
            assert self._message is not None
            # The client hands a consumed message's headers as (str, bytes | None) pairs
            # (its documented type), taken as they are: rebuilding each pair doubled the cost.
            headers = self._headers = cast(Headers, self._message.headers() or [])
        return headers

    @property
    def timestamp(self) -> tuple[int, int]:
        """The client's ``(type, milliseconds)``: type 2 is the broker's LogAppendTime."""
        stamp = self._timestamp
        if stamp is None:
            assert self._message is not None
            stamp = self._timestamp = self._message.timestamp()
        return stamp

    @property
    def where(self) -> Where:
        """The record's partition."""
        return (self.topic, self.partition)

    def _fields(self) -> tuple[object, ...]:
        return (self.topic, self.partition, self.offset, self.key, self.value, self.headers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Consumed):
            return NotImplemented
        same = self._fields() == other._fields()
        return same and self.timestamp == other.timestamp

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Consumed({self.topic!r}, {self.partition}, {self.offset}, {self.key!r}, "
            f"{self.value!r}, {self.headers!r}, {self.timestamp!r})"
        )


_new = object.__new__


def _consumed(msg: Message) -> Consumed:
    """The library's record of a message the client returned (with no error); its headers
    and stamp are read from the message when first asked for."""
    record = _new(Consumed)
    # A message without an error always has these (the stubs allow None for error events).
    record.topic = msg.topic()  # type: ignore[assignment]
    record.partition = msg.partition()  # type: ignore[assignment]
    record.offset = msg.offset()  # type: ignore[assignment]
    record.key = msg.key()
    record.value = msg.value()
    record._headers = record._timestamp = None
    record._message = msg
    return record


@dataclass
class Polled:
    """What one poll returned: records, and the partitions that reported their end."""

    records: list[Consumed]
    at_end: dict[Where, int] = field(default_factory=dict)
    """Each partition that reported its end, with the end's offset (its next record's): a
    record of it at or past that offset came after the end was reported."""
    answered: bool = True
    """The broker answered something (records, ends or errors): it is reachable."""
    out_of_range: set[Where] = field(default_factory=set)
    """Partitions whose start offset the log does not hold (``auto.offset.reset=error``)."""

    def ends_now(self, at_end: set[Where]) -> None:
        """Update ``at_end``, the partitions at their end now: those that reported it in
        this poll gone in, those with a record at or past a reported end gone out."""
        last: dict[Where, int] = {}
        for record in self.records:
            last[(record.topic, record.partition)] = record.offset
        for where in last:
            at_end.discard(where)
        for where, end in self.at_end.items():
            if last.get(where, -1) < end:
                at_end.add(where)


#: What a consumer error means to its reader: the error to stop with, or None (retried).
Failure = Callable[[KafkaError], "BrokerError | None"]


def polled(messages: list[Message], failure: Failure, refusals: Refusals | None = None) -> Polled:
    """Sort a batch of client messages into the library's records, ends and errors.

    A partition end and (asked for with ``auto.offset.reset=error``) an offset out of range
    are reported; any other error is raised when ``failure`` makes it one, and logged
    (librdkafka retries it) when ``failure`` gives None.  A refusal by the broker is its one
    line (``refusals``) either way: raised, or said and read on.
    """
    records: list[Consumed] = []
    result = Polled(records, answered=bool(messages))
    for msg in messages:
        err = msg.error()
        if err is None:
            records.append(_consumed(msg))
            continue
        code = err.code()
        where = (str(msg.topic()), int(msg.partition() or 0))
        if code == KafkaError._PARTITION_EOF:
            result.at_end[where] = int(msg.offset() or 0)
        elif code in _OUT_OF_RANGE:
            result.out_of_range.add(where)
        else:
            error = failure(err)
            if refusals is not None and (refused := refusals.of(err, msg.topic())) is not None:
                if error is not None:
                    raise refused
                refusals.say(refused)
                continue
            if error is not None:
                raise error
            logger.warning("consumer error (retried by the client): %s", err.str())
    return result


def any_error(what: str) -> Failure:
    """The failure policy of a bounded read: every error but an end stops it (retryable)."""
    return lambda err: BrokerError(f"{what} failed: {err.str()}")


def fatal_error(what: str) -> Failure:
    """The failure policy of a long read: only an error librdkafka calls fatal stops it."""
    return lambda err: (
        BrokerError(f"{what} failed: {err.str()}", retryable=False) if err.fatal() else None
    )

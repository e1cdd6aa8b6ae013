"""The one partition reader: fixed partitions from given offsets, to their ends or followed.

Every read of the library that assigns partitions itself, without joining a group (the
workflow readers and their index, the checkpoint view and its point reads, the
checkpointer, the recovery changelog, the state topics, a rebuild, the position check,
``read_topic``), reads through a :class:`PartitionReader` and is handed the library's own
records (:class:`~stepledger.kafka.records.Consumed`).  Its reads:

- :meth:`PartitionReader.to_end`: each partition from its start up to the end it first
  reports, within a deadline (the end is the partition-EOF event, never a fresh
  ListOffsets: Tansu's can fall short, CONTRIBUTING.md "The development broker");
- :meth:`PartitionReader.follow`: every poll's answer from the starts on, until a callback
  says stop or a time passes (a reader reading *through* a known offset stops there);
- :func:`read_topic`: a whole topic, decoded (the CLI's tail, the human queue, tests);
- :meth:`PartitionReader.poll` with :meth:`assign`, :meth:`unassign`, :meth:`grow` and
  :meth:`high_watermark` (the end cached from fetches, no round trip) for a reader that
  keeps its own loop (the partition index's tail).

A starved read grows its fetch wait: a short wait keeps a read's last, empty fetch cheap,
but a broker that cannot assemble an answer within it never answers (Tansu, at times).
After :func:`starved_after` with no record and no partition end, the client is replaced by
one with a 5x wait, at the positions reached.

The reader reads from partition leaders only (``client.rack`` cleared): with a rack set, a
follower's end lags records the leader acknowledged, so a read "to the end" would miss them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from stepledger import wire
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.errors import BrokerError, StepLedgerError
from stepledger.kafka.broker import Refusals, topic_partitions
from stepledger.kafka.consumer import FAST_CONSUMER, LEADER_ONLY, new_consumer
from stepledger.kafka.producer import Headers, Position
from stepledger.kafka.records import (
    BEGINNING,
    END,
    Consumed,
    Failure,
    Polled,
    Where,
    any_error,
    polled,
)
from stepledger.kafka.release import close_within

logger = logging.getLogger(__name__)

#: Records one poll hands over at most.
BATCH = 5000
#: One poll waits this long at most; partition-end events arrive within it.
POLL_S = 0.01
#: The longest fetch wait a starved read grows to (a plain consumer's default).
MAX_FETCH_WAIT_MS = 500
#: No record and no partition end for this many fetch waits (at least STARVED_MIN_S): the
#: broker cannot answer within the wait, so the wait grows 5x (waiting longer before
#: growing made Tansu's reads of one-record batches far slower).
STARVED_WAITS = 5
STARVED_MIN_S = 0.1


def starved_after(fetch_wait_ms: int) -> float:
    """Seconds without a record or a partition end after which a read counts as starved."""
    return max(STARVED_MIN_S, STARVED_WAITS * fetch_wait_ms / 1000)


def longer_wait(fetch_wait_ms: int) -> int | None:
    """The next fetch wait of a starved read (None: it is already the longest)."""
    return None if fetch_wait_ms >= MAX_FETCH_WAIT_MS else min(MAX_FETCH_WAIT_MS, fetch_wait_ms * 5)


class PartitionReader:
    """Fixed partitions read from given offsets, without a group (see the module doc).

    No network in ``__init__``: the client is made when first needed and closed by
    :meth:`close` (or the ``with`` block).  Not thread-safe: one thread reads at a time.

    Args:
        group: the ``group.id`` (a role's: no group is joined, but brokers with ACLs check
            the group's DESCRIBE).
        fetch_wait_ms: the first fetch wait (``fetch.wait.max.ms``).
        grows: a poll that finds the read starved grows the wait by itself (False: the
            caller calls :meth:`grow` on its own clock).
        what: what the read does, for its errors ("reading the log failed: ...").
        failure: which consumer errors stop the read (default: any but a partition end).
        overrides: further librdkafka settings.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group: str,
        fetch_wait_ms: int = 10,
        grows: bool = True,
        what: str = "reading the log",
        failure: Failure | None = None,
        **overrides: Any,
    ) -> None:
        self._settings = settings
        self._conf = {**FAST_CONSUMER, "group.id": group, **LEADER_ONLY, **overrides}
        self.fetch_wait_ms = fetch_wait_ms
        self.grows = grows
        self.what = what
        self._failure = failure or any_error(what)
        self._refusals = Refusals(settings, f"GROUP {group}")
        self._consumer: Consumer | None = None
        self._starts: dict[Where, int] = {}
        """Where each assigned partition started (or was reached when the wait grew)."""
        self._progress = time.monotonic()
        self.grown = 0
        """How often the fetch wait grew."""

    def __enter__(self) -> PartitionReader:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def _client(self) -> Consumer:
        if self._consumer is None:
            conf = {**self._conf, "fetch.wait.max.ms": self.fetch_wait_ms}
            self._consumer = new_consumer(self._settings.client_config(**conf))
        return self._consumer

    # -- assignment --------------------------------------------------------------------

    def assign(self, starts: Mapping[Where, int]) -> None:
        """Read exactly these partitions from these offsets (:data:`BEGINNING`, ``END`` or
        an offset); what was fetched of a former assignment is dropped."""
        parts = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in starts.items()
        ]
        try:
            self._client.assign(parts)
        except KafkaException as exc:
            raise BrokerError(f"{self.what} failed: {exc}") from exc
        self._starts = dict(starts)
        self._progress = time.monotonic()

    def unassign(self) -> None:
        """Read nothing (what was fetched is dropped, so ends reported later are fresh)."""
        self._starts = {}
        if self._consumer is None:
            return
        try:
            self._consumer.unassign()
        except (KafkaException, RuntimeError) as exc:
            raise BrokerError(f"{self.what} failed: {exc}") from exc

    # -- reading -----------------------------------------------------------------------

    def poll(self, limit: int = BATCH, wait_s: float = POLL_S, *, prompt: bool = False) -> Polled:
        """Up to ``limit`` records, and the partitions that reported their end.

        Waits up to ``wait_s`` for a full batch, or with ``prompt`` hands over what was
        fetched already, else the first record or end within ``wait_s`` (a full batch's
        wait would be paid by a read that ends in one small fetch).
        """
        consumer = self._client
        try:
            if prompt:
                messages = consumer.consume(limit, 0)
                if not messages:
                    first = consumer.poll(wait_s)
                    messages = [] if first is None else [first]
            else:
                messages = consumer.consume(limit, wait_s)
        except KafkaException as exc:
            raise BrokerError(f"{self.what} failed: {exc}") from exc
        now = time.monotonic()
        if messages:
            self._progress = now
        elif self.grows and self.starved(now):
            self.grow()
        return polled(messages, self._failure, self._refusals)

    def starved(self, now: float | None = None) -> bool:
        """True when nothing came for :func:`starved_after` the fetch wait (since the last
        record or end, or the last assignment)."""
        since = (time.monotonic() if now is None else now) - self._progress
        return since > starved_after(self.fetch_wait_ms)

    def grow(self) -> bool:
        """Replace the client by one with a 5x fetch wait, assigned at the positions reached
        (False: the wait is the longest already, or the positions are not known)."""
        wait = longer_wait(self.fetch_wait_ms)
        if wait is None or self._consumer is None:
            return False
        parts = [TopicPartition(topic, partition) for topic, partition in self._starts]
        try:
            reached = self._consumer.position(parts)  # past what was handed over
        except KafkaException:
            return False  # a new client would hand over records again: read on as it is
        for tp in reached:
            if tp.offset >= 0:
                self._starts[(tp.topic, tp.partition)] = tp.offset
        logger.debug("no answer within %d ms fetches: reading with %d ms", self.fetch_wait_ms, wait)
        self._drop()
        self.fetch_wait_ms = wait
        self.grown += 1
        self.assign(self._starts)
        return True

    def to_end(
        self,
        starts: Mapping[Where, int],
        *,
        within: float,
        through: Mapping[Where, int] | None = None,
        limit: int = BATCH,
        wait_s: float = POLL_S,
        prompt: bool = False,
    ) -> Iterator[list[Consumed]]:
        """The partitions' records from ``starts`` up to the end each first reports, in
        batches; BrokerError if they are not all read within ``within`` seconds.

        Once a partition reported its end it stays done: records written after the read
        began are newer than the read, and chasing them under a steady stream of writes
        (many agents, a slow broker) never ends.  A partition given an offset in
        ``through`` (one of its records the caller knows was written, e.g. its own) is done
        once that record was handed over, without waiting for an end: every record
        acknowledged before it lies below it.
        """
        self.assign(starts)
        deadline = time.monotonic() + within
        ended: dict[Where, int] = {}
        """Each partition done, with the first offset not handed over."""
        bounds = dict(through or {})
        while len(ended) < len(starts):
            if time.monotonic() > deadline:
                left = ", ".join(f"{t}[{p}]" for t, p in starts if (t, p) not in ended)
                raise BrokerError(f"could not read {left} to its end within {within:g} s")
            batch = self.poll(limit, wait_s, prompt=prompt)
            for where, end in batch.at_end.items():
                ended.setdefault(where, end)
            if bounds:
                for record in batch.records:
                    bound = bounds.get((record.topic, record.partition))
                    if bound is not None and record.offset >= bound:
                        ended.setdefault((record.topic, record.partition), bound + 1)
            records = batch.records
            if ended:
                records = [r for r in records if r.offset < ended.get(r.where, r.offset + 1)]
            if records:
                yield records

    def follow(
        self,
        starts: Mapping[Where, int],
        *,
        within: float | None = None,
        stop: Callable[[], bool] | None = None,
        limit: int = BATCH,
        wait_s: float = POLL_S,
        prompt: bool = False,
    ) -> Iterator[Polled]:
        """Every poll's answer from ``starts`` on (an empty one too), until ``stop`` returns
        True (asked before each poll) or ``within`` seconds passed."""
        self.assign(starts)
        deadline = None if within is None else time.monotonic() + within
        while stop is None or not stop():
            if deadline is not None and time.monotonic() >= deadline:
                return
            yield self.poll(limit, wait_s, prompt=prompt)

    # -- partition ends, without reading -----------------------------------------------

    def high_watermark(self, where: Where) -> int | None:
        """The partition's end as the last fetch reported it (no round trip; None before
        one did)."""
        if self._consumer is None:
            return None
        try:
            _, high = self._consumer.get_watermark_offsets(TopicPartition(*where), cached=True)
        except (KafkaException, RuntimeError):
            return None
        return None if high < 0 else int(high)

    def watermarks(self, where: Where, *, timeout: float = 5.0) -> tuple[int, int]:
        """(log start, end) of the partition, asked of the broker now (ListOffsets).

        The dev broker can report an end short of its last record after a batched produce:
        an end that decides "read everything" comes from :meth:`to_end`, not from here.
        """
        topic, partition = where
        try:
            low, high = self._client.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
        except KafkaException as exc:
            raise BrokerError(f"cannot read the offsets of {topic}[{partition}]: {exc}") from None
        return int(low), int(high)

    def brokers(self, topic: str, *, timeout: float = 5.0) -> int:
        """How many brokers the cluster has (0 when it cannot say in time)."""
        try:
            listed = self._client.list_topics(topic, timeout=timeout)
        except KafkaException:
            return 0
        return len(listed.brokers)

    def close(self) -> None:
        """Close the client (bounded: see :mod:`stepledger.kafka.release`)."""
        self._starts = {}
        self._drop()

    def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            close_within(consumer.close, "consumer")


def records_to_end(
    settings: Settings,
    starts: Mapping[Where, int],
    *,
    group: str,
    within: float,
    **options: Any,
) -> Iterator[list[Consumed]]:
    """:meth:`PartitionReader.to_end` on a reader of its own, closed when the read ends."""
    with PartitionReader(settings, group=group, **options) as reader:
        yield from reader.to_end(starts, within=within)


class Decoder(Protocol):
    """What :func:`read_topic` decodes values with (a :class:`~stepledger.codec.Codec`)."""

    def decode(self, data: bytes | None, /) -> Event: ...


@dataclass(frozen=True)
class Record:
    """One record of :func:`read_topic`: its position, raw parts and the decoded event or
    the error that kept it from decoding."""

    position: Position
    key: bytes | None
    value: bytes | None
    headers: Headers
    event: Event | None
    error: StepLedgerError | None


def read_topic(
    settings: Settings,
    codec: Decoder,
    *,
    topic: str | None = None,
    from_beginning: bool = True,
    idle_timeout: float = 1.0,
    max_time: float | None = None,
    follow: bool = False,
    stopped: Callable[[], bool] | None = None,
) -> Iterator[Record]:
    """Yield decoded records of every partition until each reached its end and stayed idle.

    ``stopped`` ends the read (also a ``follow``) as soon as it returns True; it is asked
    at least every 100 ms.
    """
    topic = topic or settings.topic
    start = BEGINNING if from_beginning else END
    starts = dict.fromkeys(((topic, p) for p in topic_partitions(settings, topic)), start)
    at_end: set[Where] = set()
    last_data = time.monotonic()

    def done() -> bool:
        if stopped is not None and stopped():
            return True
        idle = time.monotonic() - last_data > idle_timeout
        return not follow and len(at_end) == len(starts) and idle

    group = settings.group(wire.READER_ROLE)
    with PartitionReader(settings, group=group, fetch_wait_ms=50, grows=False) as reader:
        for batch in reader.follow(starts, within=max_time, stop=done, wait_s=0.1, prompt=True):
            batch.ends_now(at_end)
            if batch.records:
                last_data = time.monotonic()
            for record in batch.records:
                yield _decoded(record, codec)


def _decoded(record: Consumed, codec: Decoder) -> Record:
    try:
        event, error = codec.decode(record.value), None
    except StepLedgerError as exc:
        event, error = None, exc
    position = Position(record.topic, record.partition, record.offset)
    return Record(position, record.key, record.value, record.headers, event, error)

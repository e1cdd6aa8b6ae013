"""The one consumer adapter: group members (daemons) and fixed-partition readers.

Every module that reads the log gets its confluent ``Consumer`` here:

- :class:`GroupConsumer` is a consumer-group member (the projector, the recovery daemon).
  It renders the group settings (:class:`Membership`) to librdkafka's keys in one place,
  rebalances incrementally (``cooperative-sticky`` on any broker, the KIP-848 protocol
  ``group.protocol=consumer`` on Apache Kafka 4.x), takes part as a static member when
  given an instance id (a restart within the session moves no partition), and turns a
  consumer error into one policy: a partition end is reported, a fatal error (a static
  member fenced by another process with its instance id, a session timeout the broker
  refuses) raises :class:`~stepledger.errors.BrokerError`, anything else is retried by
  librdkafka and logged.
- :func:`assigned_consumer` reads fixed partitions from given offsets without joining a
  group (readers, the rebuild, the position check); :func:`read_topic` decodes a topic.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from stepledger import wire
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.errors import BrokerError, ConfigError, StepLedgerError
from stepledger.kafka.broker import topic_partitions
from stepledger.kafka.producer import Headers, Position, position_of
from stepledger.kafka.release import close_within

logger = logging.getLogger(__name__)

#: Settings that let a consumer-group join finish in about a second on the dev broker
#: (defaults take ~23 s on Tansu) and a fetch return quickly when data arrives.
FAST_CONSUMER = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "fetch.wait.max.ms": 50,
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
}
#: Read from partition leaders only: with ``client.rack`` set (and a rack-aware replica
#: selector on the brokers) librdkafka fetches from a follower, whose end lags records the
#: leader acknowledged, so a read "to the end" would miss them.
LEADER_ONLY = {"client.rack": ""}
#: Group settings librdkafka refuses under KIP-848 (the broker owns them there).
_CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")
#: librdkafka's ``max.poll.interval.ms`` default: a longer session is refused by the client.
_MAX_SESSION_S = 300.0
#: Kafka's rule for a group.instance.id (as for topic names).
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

GroupProtocol = Literal["classic", "consumer"]
"""``classic`` (JoinGroup/SyncGroup, cooperative-sticky) or ``consumer`` (KIP-848)."""
GROUP_PROTOCOLS: tuple[GroupProtocol, ...] = ("classic", "consumer")
Where = tuple[str, int]
OnPartitions = Callable[[list[KafkaPartition]], None]
#: An assignment callback; the partitions it returns are assigned paused (held back).
OnAssign = Callable[[list[KafkaPartition]], "list[KafkaPartition] | None"]


@dataclass(frozen=True)
class Membership:
    """How a daemon takes part in its consumer group."""

    group: str
    """The consumer group id; instances of one group split the partitions."""
    session_timeout_s: float = 6.0
    """How long the group waits for a silent member before moving its partitions (classic
    protocol; under KIP-848 the broker's ``group.consumer.session.timeout.ms`` decides)."""
    protocol: GroupProtocol | None = None
    """The rebalance protocol; None: ``-X group.protocol`` if given, else ``classic``."""
    instance_id: str | None = None
    """Static membership (``group.instance.id``): a restart within the session keeps its
    partitions; a second live process with the same id is fenced and stops."""
    client_id: str | None = None
    """The client id the broker shows for this member (None: librdkafka's default)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further librdkafka consumer settings, applied last."""

    def __post_init__(self) -> None:
        if not self.group:
            raise ConfigError("a consumer group id must not be empty")
        if not 1.0 <= self.session_timeout_s <= _MAX_SESSION_S:
            raise ConfigError(
                f"session timeout {self.session_timeout_s:g}s is out of range "
                f"(1-{_MAX_SESSION_S:g} s; it must stay below librdkafka's max.poll.interval.ms)"
            )
        if self.instance_id is not None and not _INSTANCE_ID.match(self.instance_id):
            raise ConfigError(
                f"instance id {self.instance_id!r} must be 1-249 characters of "
                "letters, digits, '.', '_' or '-'"
            )
        if self.protocol is not None and self.protocol not in GROUP_PROTOCOLS:
            raise ConfigError(f"group protocol must be one of {GROUP_PROTOCOLS}")

    def config(self, settings: Settings) -> dict[str, Any]:
        """The librdkafka settings of this member (without callbacks)."""
        protocol = self.protocol or str(settings.kafka.get("group.protocol", "classic"))
        session_ms = int(self.session_timeout_s * 1000)
        conf: dict[str, Any] = {
            **FAST_CONSUMER,
            "group.id": self.group,
            "group.protocol": protocol,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, session_ms // 10),
            # Only the partitions that move are revoked and assigned: the others keep going.
            "partition.assignment.strategy": "cooperative-sticky",
        }
        if self.instance_id is not None:
            conf["group.instance.id"] = self.instance_id
        if self.client_id is not None:
            conf["client.id"] = self.client_id
        conf = settings.client_config(**{**conf, **self.extra})
        if conf["group.protocol"] == "consumer":
            # KIP-848 is incremental by design; the broker owns session and heartbeat.
            for key in _CLASSIC_ONLY:
                conf.pop(key, None)
        return conf

    @property
    def fence_timing(self) -> tuple[float, float]:
        """The (session, heartbeat) seconds a member must poll within to own its partitions."""
        session = float(self.extra.get("session.timeout.ms", self.session_timeout_s * 1000))
        beat = float(self.extra.get("heartbeat.interval.ms", max(100.0, session / 10)))
        return session / 1000, beat / 1000


@dataclass(slots=True)
class Consumed:
    """One record as it was read, not decoded: where it sits, its bytes, headers and stamp.

    The library's own record type: what reads a topic above this package (the projector's
    engine, the recovery daemon, a rebuild) is handed these, never the client's messages.
    Nothing changes one once read; it is not frozen only because a frozen dataclass's
    constructor costs 1.3 us more per record (1.9 against 0.6), on every record a daemon reads.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp: tuple[int, int] = (0, -1)
    """The client's ``(type, milliseconds)``: type 2 is the broker's LogAppendTime."""


def consumed(msg: Message) -> Consumed:
    """The library's record for one message the client returned (with no error)."""
    return Consumed(
        str(msg.topic()),
        int(msg.partition() or 0),
        int(msg.offset() or 0),
        msg.key(),
        msg.value(),
        message_headers(msg),
        msg.timestamp(),
    )


@dataclass
class Polled:
    """What one poll of the group returned: records, and partitions that reached their end."""

    records: list[Consumed]
    at_end: list[Where]
    answered: bool
    """The broker answered something (records, ends or errors): it is reachable."""


def consumer_failure(err: KafkaError, instance_id: str | None = None) -> str | None:
    """Why a consumer error must stop the process, or None when librdkafka retries it.

    Besides librdkafka's fatal errors (a static member fenced by another process with the
    same instance id arrives as ``_FATAL``, whose ``fatal()`` is False): a session timeout
    the broker refuses.  librdkafka retries that JoinGroup forever, so a daemon would run
    without ever joining (measured on Apache Kafka, default minimum 6 s).
    """
    if err.code() == KafkaError.INVALID_SESSION_TIMEOUT:
        return (
            f"{err.str()}: the broker's group.min.session.timeout.ms and "
            "group.max.session.timeout.ms do not allow this session timeout (--session-timeout)"
        )
    if err.code() != KafkaError._FATAL and not err.fatal():
        return None
    reason = err.str().split(": Fatal consumer error")[0].split(": ConsumerGroupHeartbeat")[0]
    if instance_id is not None and "instance" in reason.lower():
        return f"{reason} (instance id {instance_id!r}: is another process running with it?)"
    return reason


class GroupConsumer:
    """A consumer-group member: incremental assignment, static membership, one error policy.

    No network happens in ``__init__``; the client is created by :meth:`subscribe`.
    """

    def __init__(
        self,
        settings: Settings,
        membership: Membership,
        *,
        error_cb: Callable[[KafkaError], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.membership = membership
        self.config = membership.config(settings)
        if error_cb is not None:
            self.config["error_cb"] = error_cb
        if logger is not None:
            self.config["logger"] = logger
        self._client: Consumer | None = None

    @property
    def incremental(self) -> bool:
        """True when assignment callbacks receive only the partitions that move."""
        conf = self.config
        strategy = str(conf.get("partition.assignment.strategy", ""))
        return conf.get("group.protocol") == "consumer" or "cooperative" in strategy

    @property
    def client(self) -> Consumer:
        """The confluent consumer (after :meth:`subscribe`)."""
        if self._client is None:
            raise BrokerError("the group consumer is not subscribed yet", retryable=False)
        return self._client

    def subscribe(
        self,
        topics: list[str],
        *,
        on_assign: OnAssign,
        on_revoke: OnPartitions,
        on_lost: OnPartitions | None = None,
    ) -> None:
        """Join the group; callbacks run inside :meth:`poll` on the polling thread.

        ``on_assign`` may set each partition's offset; the partitions are taken after it
        returns, and those it returns are paused at once (:meth:`release` resumes one).
        ``on_revoke`` (and ``on_lost``, which defaults to it) run while the partitions are
        still ours; they are given back after the callback, even if it raised.
        """
        try:
            self._client = Consumer(self.config)
        except KafkaException as exc:
            raise BrokerError(f"invalid Kafka consumer settings: {exc}", retryable=False) from exc
        lost = on_lost or on_revoke
        self._client.subscribe(
            topics,
            on_assign=lambda c, ps: self._take(on_assign, ps),
            on_revoke=lambda c, ps: self._give_back(on_revoke, ps),
            on_lost=lambda c, ps: self._give_back(lost, ps),
        )

    def _take(self, callback: OnAssign, partitions: list[KafkaPartition]) -> None:
        held = callback(partitions)
        if self.incremental:
            self.client.incremental_assign(partitions)
        else:
            self.client.assign(partitions)
        if held:
            self.client.pause(held)

    def release(self, partition: KafkaPartition) -> bool:
        """Start reading a paused (held) partition at ``partition.offset``; False: not yet.

        The position is set while the partition is still paused, so no record from an
        earlier position reaches the caller.  librdkafka refuses a seek on a partition
        whose fetcher has not started yet: the caller tries again later.
        """
        try:
            self.client.seek(partition)
        except KafkaException as exc:
            logger.debug("seek of held partition %s refused: %s", partition, exc)
            return False
        self.client.resume([partition])
        return True

    def _give_back(self, callback: OnPartitions, partitions: list[KafkaPartition]) -> None:
        try:
            callback(partitions)
        finally:
            if self.incremental:
                self.client.incremental_unassign(partitions)
            else:
                self.client.unassign()

    def poll(self, size: int, timeout: float) -> Polled:
        """Up to ``size`` records; raise BrokerError on an error that must stop the member."""
        messages = self.client.consume(size, timeout)
        records: list[Consumed] = []
        at_end: list[Where] = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(consumed(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.append((str(msg.topic()), int(msg.partition() or 0)))
            else:
                failure = consumer_failure(err, self.membership.instance_id)
                if failure is not None:
                    raise BrokerError(f"consumer failed: {failure}", retryable=False)
                logger.warning("consumer error (retried by the client): %s", err.str())
        return Polled(records, at_end, bool(messages))

    def commit(self, offsets: list[KafkaPartition]) -> None:
        """Commit offsets to the group asynchronously (an optimisation for lag tools)."""
        try:
            self.client.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            logger.debug("kafka offset commit failed: %s", exc)

    def reachable(self, topic: str | None = None, timeout: float = 0.5) -> bool:
        """True when the broker answers a metadata request (an idle topic sends nothing)."""
        try:
            if topic is None:
                self.client.list_topics(timeout=timeout)
            else:
                self.client.list_topics(topic, timeout=timeout)
        except KafkaException:
            return False
        return True

    def high_watermark(self, partition: KafkaPartition) -> int | None:
        """The partition's end as cached from fetches (never a fresh ListOffsets)."""
        try:
            _, high = self.client.get_watermark_offsets(partition, cached=True)
        except KafkaException:
            return None
        return None if high < 0 else int(high)

    def close(self) -> None:
        """Leave the group (a static member keeps its place for the session) and close."""
        if self._client is not None:
            self._client.close()


@contextlib.contextmanager
def assigned_consumer(
    settings: Settings, starts: Iterable[KafkaPartition], *, group: str, **overrides: Any
) -> Iterator[Consumer]:
    """A consumer reading fixed partitions from given offsets (no group join), closed on exit.

    It reads from partition leaders only, so a partition end it reports is the leader's.
    """
    consumer = _assigned_client(settings, starts, group, overrides)
    try:
        yield consumer
    finally:
        close_within(consumer.close, "consumer")


def _assigned_client(
    settings: Settings, starts: Iterable[KafkaPartition], group: str, overrides: dict[str, Any]
) -> Consumer:
    """A consumer (no group join, leaders only) assigned to fixed partitions and offsets."""
    try:
        consumer = Consumer(
            settings.client_config(
                **{**FAST_CONSUMER, "group.id": group, **LEADER_ONLY, **overrides}
            )
        )
    except KafkaException as exc:
        raise BrokerError(f"invalid Kafka consumer settings: {exc}", retryable=False) from exc
    try:
        consumer.assign(list(starts))
    except KafkaException as exc:
        close_within(consumer.close, "consumer")
        raise BrokerError(f"reading the log failed: {exc}") from exc
    return consumer


#: The longest fetch wait a starved read grows to (a plain consumer's default).
MAX_FETCH_WAIT_MS = 500
#: No record and no partition end for this many fetch waits (at least STARVED_MIN_S): the
#: broker cannot answer within the wait, so the wait grows 5x (60k one-record batches on the
#: dev broker: 2 -> 10 -> 50 -> 250 ms, 1.15x a plain read; 25 waits made it 3.5x).
STARVED_WAITS = 5
STARVED_MIN_S = 0.1


def starved_after(fetch_wait_ms: int) -> float:
    """Seconds without a record or a partition end after which a read counts as starved."""
    return max(STARVED_MIN_S, STARVED_WAITS * fetch_wait_ms / 1000)


def longer_wait(fetch_wait_ms: int) -> int | None:
    """The next fetch wait of a starved read (None: it is already the longest)."""
    return None if fetch_wait_ms >= MAX_FETCH_WAIT_MS else min(MAX_FETCH_WAIT_MS, fetch_wait_ms * 5)


class EndReader:
    """A fixed-partition read whose fetch wait grows while the broker answers nothing.

    A short fetch wait keeps a read's last, empty fetch cheap.  But a broker that cannot
    assemble an answer within it never answers: the dev broker reading its storage after a
    graceful restart returned every 10 ms fetch empty, so a resume's read to the end failed
    after its 120 s limit, every time.  After :func:`starved_after` with no record and no
    partition end, the consumer is replaced by one with a 5x wait, at the positions reached.
    """

    def __init__(
        self,
        settings: Settings,
        starts: Iterable[KafkaPartition],
        *,
        group: str,
        fetch_wait_ms: int,
    ) -> None:
        self._settings, self._group = settings, group
        self.fetch_wait_ms = fetch_wait_ms
        self._next = {(tp.topic, tp.partition): tp.offset for tp in starts}
        self._consumer: Consumer | None = None
        self._progress = time.monotonic()
        self.grown = 0
        """How often the wait grew."""
        self._open()

    def _open(self) -> None:
        starts = [KafkaPartition(t, p, o) for (t, p), o in self._next.items()]
        wait = {"fetch.wait.max.ms": self.fetch_wait_ms}
        self._consumer = _assigned_client(self._settings, starts, self._group, wait)

    def consume(self, limit: int, timeout: float) -> list[Message]:
        """Up to ``limit`` records and events, as ``Consumer.consume``."""
        assert self._consumer is not None, "the reader is closed"
        batch = self._consumer.consume(limit, timeout)
        now = time.monotonic()
        if batch:
            self._progress = now
        elif now - self._progress > starved_after(self.fetch_wait_ms):
            self._grow(now)
        return batch

    def _grow(self, now: float) -> None:
        wait = longer_wait(self.fetch_wait_ms)
        if wait is None or self._consumer is None:
            return
        parts = [KafkaPartition(t, p) for t, p in self._next]
        try:
            reached = self._consumer.position(parts)  # past what was handed over
        except KafkaException:
            return  # a new consumer would hand over records again: read on as it is
        for tp in reached:
            if tp.offset >= 0:
                self._next[(tp.topic, tp.partition)] = tp.offset
        logger.debug("no answer within %d ms fetches: reading with %d ms", self.fetch_wait_ms, wait)
        self.close()
        self.fetch_wait_ms, self._progress = wait, now
        self.grown += 1
        self._open()

    def close(self) -> None:
        """Close the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            close_within(consumer.close, "consumer")


@contextlib.contextmanager
def reading_to_end(
    settings: Settings, starts: Iterable[KafkaPartition], *, group: str, fetch_wait_ms: int
) -> Iterator[EndReader]:
    """An :class:`EndReader` over fixed partitions from given offsets, closed on exit."""
    reader = EndReader(settings, starts, group=group, fetch_wait_ms=fetch_wait_ms)
    try:
        yield reader
    finally:
        reader.close()


def partition_end(msg: Message) -> bool:
    """True for a partition-end event; raise BrokerError for any other consumer error."""
    err = msg.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    raise BrokerError(f"reading the log failed: {err.str()}")


@dataclass(frozen=True)
class Record:
    """One consumed record: its position, raw parts and the decoded event or the error."""

    position: Position
    key: bytes | None
    value: bytes | None
    headers: Headers
    event: Event | None
    error: StepLedgerError | None


def read_topic(
    settings: Settings,
    codec: Codec,
    *,
    topic: str | None = None,
    from_beginning: bool = True,
    idle_timeout: float = 1.0,
    max_time: float | None = None,
    follow: bool = False,
    stopped: Callable[[], bool] | None = None,
) -> Iterator[Record]:
    """Yield decoded records of every partition until each reached its end and stayed idle.

    The end is detected from partition-EOF events, not from a fresh ListOffsets (which the
    dev broker answers wrongly after batched produces).  ``stopped`` ends the read (also a
    ``follow``) as soon as it returns True; it is asked at least every 100 ms.
    """
    topic = topic or settings.topic
    partitions = topic_partitions(settings, topic)
    start = OFFSET_BEGINNING if from_beginning else -1  # -1 is OFFSET_END
    starts = [KafkaPartition(topic, p, start) for p in partitions]
    ended: set[int] = set()
    began = last_data = time.monotonic()
    with assigned_consumer(settings, starts, group=settings.group(wire.READER_ROLE)) as consumer:
        while True:
            now = time.monotonic()
            if max_time is not None and now - began > max_time:
                return
            if stopped is not None and stopped():
                return
            if not follow and len(ended) == len(partitions) and now - last_data > idle_timeout:
                return
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if partition_end(msg):
                ended.add(int(msg.partition() or 0))
                continue
            ended.discard(int(msg.partition() or 0))
            last_data = time.monotonic()
            yield _record(msg, codec)


def _record(msg: Message, codec: Codec) -> Record:
    value, key = msg.value(), msg.key()
    try:
        event, error = codec.decode(value), None
    except StepLedgerError as exc:
        event, error = None, exc
    return Record(position_of(msg), key, value, message_headers(msg), event, error)


def message_headers(msg: Message) -> Headers:
    """A consumed record's headers as they were produced (a header without a value stays None).

    The client hands a consumed message's headers as a list of ``(str, bytes | None)`` pairs
    (its documented type), taken as they are: rebuilding every pair cost 1.5 us per record.
    """
    # Typed ``str | bytes`` for produced messages; a consumed one's values are bytes or None
    # (tests/integration/test_consumed_headers.py produces all three through a broker).
    return cast(Headers, msg.headers() or [])

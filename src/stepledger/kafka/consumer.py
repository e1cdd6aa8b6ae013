"""The consumer-group member every daemon reads through, and how consumers are made.

:class:`GroupConsumer` is a consumer-group member (the projector, the recovery daemon).  It
renders the group settings (:class:`Membership`) to librdkafka's keys in one place,
rebalances incrementally (``cooperative-sticky`` on any broker, the KIP-848 protocol
``group.protocol=consumer`` on Apache Kafka 4.x), takes part as a static member when given
an instance id (a restart within the session moves no partition), and turns a consumer
error into one policy: a partition end is reported, a fatal error (a static member fenced
by another process with its instance id, a session timeout the broker refuses) raises
:class:`~stepledger.errors.BrokerError`, anything else is retried by librdkafka and logged.
Its callbacks and polls speak the library's types (:mod:`stepledger.kafka.records`).

Fixed partitions, without a group, are read by :mod:`stepledger.kafka.reader`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from stepledger.config import Settings
from stepledger.errors import BrokerError, ConfigError
from stepledger.kafka.broker import Refusals
from stepledger.kafka.records import BEGINNING, Polled, Where, polled

logger = logging.getLogger(__name__)

#: Settings that let a consumer-group join finish quickly (Tansu's joins are slow with
#: librdkafka's defaults) and a fetch return quickly when data arrives.
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
OnPartitions = Callable[[list[Where]], None]


@dataclass(frozen=True)
class Placement:
    """What an assignment callback decided: where each partition is read from, and which
    are held back (assigned paused until :meth:`GroupConsumer.release`)."""

    starts: Mapping[Where, int]
    """Each partition's first offset to read (absent: the beginning)."""
    held: Collection[Where] = ()


#: An assignment callback: given the partitions assigned, where they are read from.
OnAssign = Callable[[list[Where]], Placement]


def new_consumer(conf: dict[str, Any]) -> Consumer:
    """A librdkafka consumer (no network yet); BrokerError for settings it refuses."""
    try:
        return Consumer(conf)
    except KafkaException as exc:
        raise BrokerError(f"invalid Kafka consumer settings: {exc}", retryable=False) from exc


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
        self.settings = settings
        self.config = membership.config(settings)
        self._refusals = Refusals(settings, f"GROUP {self.config.get('group.id')}")
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
    def _consumer(self) -> Consumer:
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

        ``on_assign`` says where each partition is read from; the partitions are taken
        after it returns, and those it holds are paused at once (:meth:`release` resumes
        one).  ``on_revoke`` (and ``on_lost``, which defaults to it) run while the
        partitions are still ours; they are given back after the callback, even if it raised.
        """
        self._client = new_consumer(self.config)
        lost = on_lost or on_revoke
        self._client.subscribe(
            topics,
            on_assign=lambda c, ps: self._take(on_assign, ps),
            on_revoke=lambda c, ps: self._give_back(on_revoke, ps),
            on_lost=lambda c, ps: self._give_back(lost, ps),
        )

    def _take(self, callback: OnAssign, partitions: list[TopicPartition]) -> None:
        placed = callback([(tp.topic, tp.partition) for tp in partitions])
        for tp in partitions:
            tp.offset = placed.starts.get((tp.topic, tp.partition), BEGINNING)
        if self.incremental:
            self._consumer.incremental_assign(partitions)
        else:
            self._consumer.assign(partitions)
        held = set(placed.held)
        if held:
            self._consumer.pause([tp for tp in partitions if (tp.topic, tp.partition) in held])

    def release(self, where: Where, offset: int) -> bool:
        """Start reading a paused (held) partition at ``offset``; False: not yet.

        The position is set while the partition is still paused, so no record from an
        earlier position reaches the caller.  librdkafka refuses a seek on a partition
        whose fetcher has not started yet: the caller tries again later.
        """
        partition = TopicPartition(where[0], where[1], offset)
        try:
            self._consumer.seek(partition)
        except KafkaException as exc:
            logger.debug("seek of held partition %s refused: %s", partition, exc)
            return False
        self._consumer.resume([partition])
        return True

    def _give_back(self, callback: OnPartitions, partitions: list[TopicPartition]) -> None:
        try:
            callback([(tp.topic, tp.partition) for tp in partitions])
        finally:
            if self.incremental:
                self._consumer.incremental_unassign(partitions)
            else:
                self._consumer.unassign()

    def poll(self, size: int, timeout: float) -> Polled:
        """Up to ``size`` records; raise BrokerError on an error that must stop the member.

        A refusal by the broker (no READ on the group or a topic, a refused login) is said
        in one line naming what to grant, and the member keeps running (:class:`Refusals`).
        """
        return polled(self._consumer.consume(size, timeout), self._failure, self._refusals)

    def _failure(self, err: KafkaError) -> BrokerError | None:
        reason = consumer_failure(err, self.membership.instance_id)
        return (
            None if reason is None else BrokerError(f"consumer failed: {reason}", retryable=False)
        )

    def commit(self, offsets: Mapping[Where, int]) -> None:
        """Commit offsets to the group asynchronously (an optimisation for lag tools)."""
        parts = [TopicPartition(topic, partition, n) for (topic, partition), n in offsets.items()]
        try:
            self._consumer.commit(offsets=parts, asynchronous=True)
        except KafkaException as exc:
            logger.debug("kafka offset commit failed: %s", exc)

    def reachable(self, topic: str | None = None, timeout: float = 0.5) -> bool:
        """True when the broker answers a metadata request (an idle topic sends nothing)."""
        try:
            if topic is None:
                self._consumer.list_topics(timeout=timeout)
            else:
                self._consumer.list_topics(topic, timeout=timeout)
        except KafkaException:
            return False
        return True

    def high_watermark(self, where: Where) -> int | None:
        """The partition's end as cached from fetches (never a fresh ListOffsets)."""
        try:
            _, high = self._consumer.get_watermark_offsets(TopicPartition(*where), cached=True)
        except KafkaException:
            return None
        return None if high < 0 else int(high)

    def close(self) -> None:
        """Leave the group (a static member keeps its place for the session) and close."""
        if self._client is not None:
            self._client.close()

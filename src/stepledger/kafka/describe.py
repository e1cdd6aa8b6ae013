"""What the cluster says about itself, in the library's types: brokers, topics, configs, groups.

The doctor, the topic checks, the recovery daemon's look at other groups and the development
clusters ask the admin API through a :class:`ClusterView`; every answer is plain data and
every failure a :class:`~stepledger.errors.BrokerError` whose message is the client's first
line (a broker that cannot answer, a principal without the ACL).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka.broker import admin
from stepledger.kafka.records import Where


@dataclass(frozen=True)
class Replicas:
    """Where one partition lives: its leader (-1: none), its replicas and those in sync."""

    leader: int
    replicas: tuple[int, ...]
    in_sync: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """The brokers the cluster has and the partitions of its topics (readable ones only)."""

    brokers: int
    topics: dict[str, dict[int, Replicas]]
    """Each topic that answered with its partitions, by partition number."""
    names: frozenset[str]
    """Every topic listed, whether or not it answered."""
    cluster_id: str = ""
    """The cluster's id as its metadata gives it ("" when it gives none)."""


@dataclass(frozen=True)
class GroupMember:
    """One member of a consumer group: its client id and the topics assigned to it."""

    client_id: str
    topics: frozenset[str]


class ClusterView:
    """Read-only questions to the cluster's admin API, one client (no network until asked)."""

    def __init__(self, settings: Settings) -> None:
        self._client = admin(settings)

    def layout(self, topic: str | None = None, *, timeout: float = 10.0) -> Layout:
        """The brokers and topics (only ``topic`` when given: a request naming a topic may
        create it on some brokers, so name only one that exists)."""
        try:
            if topic is None:
                meta = self._client.list_topics(timeout=timeout)
            else:
                meta = self._client.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise BrokerError(_first_line(exc)) from None
        topics = {
            name: {
                number: Replicas(int(p.leader), tuple(p.replicas), tuple(p.isrs))
                for number, p in info.partitions.items()
            }
            for name, info in meta.topics.items()
            if info.error is None and info.partitions
        }
        return Layout(len(meta.brokers), topics, frozenset(meta.topics), meta.cluster_id or "")

    def topic_configs(self, topic: str, *, timeout: float = 10.0) -> dict[str, str]:
        """The topic's configs that have a value (BrokerError: refused, or no answer)."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            futures = self._client.describe_configs([resource], request_timeout=timeout)
            entries = next(iter(futures.values())).result(timeout)
        except Exception as exc:  # refused, unsupported (the dev broker), or no answer
            raise BrokerError(_first_line(exc)) from None
        return {
            name: str(entry.value) for name, entry in entries.items() if entry.value is not None
        }

    def group_ids(self, *, timeout: float = 10.0) -> list[str]:
        """Every consumer group the cluster lists."""
        try:
            listed = self._client.list_consumer_groups(request_timeout=timeout).result(timeout)
        except Exception as exc:  # a broker that cannot list groups (the dev broker)
            raise BrokerError(_first_line(exc)) from None
        return [str(g.group_id) for g in listed.valid]

    def members(
        self, group_ids: Iterable[str], *, timeout: float = 10.0
    ) -> dict[str, list[GroupMember]]:
        """Each group's members (BrokerError as soon as one group cannot be described)."""
        ids = list(group_ids)
        if not ids:
            return {}
        try:
            described = self._client.describe_consumer_groups(ids, request_timeout=timeout)
            return {
                group_id: [_member(m) for m in future.result(timeout).members]
                for group_id, future in described.items()
            }
        except Exception as exc:
            raise BrokerError(_first_line(exc)) from None

    def committed(self, group_id: str, *, timeout: float = 10.0) -> dict[Where, int]:
        """The offsets the group committed (negative: none for that partition)."""
        request = [ConsumerGroupTopicPartitions(group_id)]
        try:
            found = self._client.list_consumer_group_offsets(request)[group_id].result(timeout)
        except Exception as exc:
            raise BrokerError(_first_line(exc)) from None
        return {(tp.topic, tp.partition): int(tp.offset) for tp in found.topic_partitions}

    def ends(self, partitions: Iterable[Where], *, timeout: float = 10.0) -> dict[Where, int]:
        """Each partition's end now (ListOffsets: an estimate on the dev broker, see
        :mod:`stepledger.kafka.reader`)."""
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked: dict[TopicPartition, Any] = {TopicPartition(t, p): latest for t, p in partitions}
        if not asked:
            return {}
        try:
            return {
                (tp.topic, tp.partition): int(future.result(timeout).offset)
                for tp, future in self._client.list_offsets(asked).items()
            }
        except Exception as exc:
            raise BrokerError(_first_line(exc)) from None

    def topic_operations(
        self, topics: Iterable[str], *, timeout: float = 10.0
    ) -> dict[str, frozenset[str] | None]:
        """What the broker lets this principal do on each topic (KIP-430: the operations it
        reports as authorised, e.g. ``READ``); None for a topic it would not describe."""
        names = sorted(set(topics))
        if not names:
            return {}
        try:
            futures = self._client.describe_topics(
                TopicCollection(names),
                request_timeout=timeout,
                include_authorized_operations=True,
            )
        except Exception as exc:
            raise BrokerError(_first_line(exc)) from None
        found: dict[str, frozenset[str] | None] = {}
        for name, future in futures.items():
            try:
                found[name] = _operations(future.result(timeout).authorized_operations)
            except KafkaException:  # not authorised to describe it, or no such topic
                found[name] = None
        return found

    def cluster_operations(self, *, timeout: float = 10.0) -> frozenset[str]:
        """What the broker lets this principal do on the cluster (``ALTER``: ACLs)."""
        try:
            described = self._client.describe_cluster(
                request_timeout=timeout, include_authorized_operations=True
            ).result(timeout)
        except Exception as exc:
            raise BrokerError(_first_line(exc)) from None
        return _operations(described.authorized_operations)


def _operations(found: Iterable[Any] | None) -> frozenset[str]:
    # A principal with no operation at all is answered with none (measured): an empty set.
    return frozenset(str(op.name) for op in found or ())


def _member(member: Any) -> GroupMember:
    assignment = member.assignment
    partitions = [] if assignment is None else assignment.topic_partitions or []
    return GroupMember(str(member.client_id or ""), frozenset(tp.topic for tp in partitions))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

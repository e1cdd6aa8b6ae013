"""Reading what the doctor judges from Kafka: brokers, topics, their configs, groups, lag."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stepledger.config import Settings
from stepledger.doctor.checks import ClusterFacts, GroupFacts, Member, TopicFacts
from stepledger.errors import BrokerError
from stepledger.kafka import admin
from stepledger.kafka.client import (
    AdminClient,
    ConfigResource,
    ConsumerGroupTopicPartitions,
    KafkaException,
    OffsetSpec,
    ResourceType,
    TopicPartition,
)
from stepledger.logid import resolve
from stepledger.statetopics import origins

_TIMEOUT = 10.0
#: The newest records read of each partition of a state topic.
STATE_SAMPLE = 1000


def gather(settings: Settings, *, checkpoint_topic: str, groups: Iterable[str]) -> ClusterFacts:
    """Read the cluster once: what a broker will not say becomes a problem, not an error."""
    client = admin(settings)
    try:
        meta = client.list_topics(timeout=_TIMEOUT)
    except KafkaException as exc:
        raise BrokerError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from None
    names = [settings.topic, settings.dlq_topic, checkpoint_topic, settings.recovery_state_topic]
    problems: list[str] = []
    topics = {}
    for name in dict.fromkeys(names):
        info = meta.topics.get(name)
        if info is None or info.error is not None or not info.partitions:
            continue
        replicas = min(len(p.replicas) for p in info.partitions.values())
        configs = _configs(client, name, problems)
        topics[name] = TopicFacts(name, len(info.partitions), replicas, configs)
    described = _groups(client, list(dict.fromkeys(groups)), topics, problems)
    state_topics = (checkpoint_topic, settings.recovery_state_topic)
    identity, origins = _state(settings, topics, state_topics, problems)
    return ClusterFacts(
        brokers=len(meta.brokers),
        step_topic=settings.topic,
        dlq_topic=settings.dlq_topic,
        checkpoint_topic=checkpoint_topic,
        topics=topics,
        groups=described,
        problems=tuple(problems),
        identity=identity,
        state_origins=origins,
        recovery_state_topic=settings.recovery_state_topic,
        cluster_id=meta.cluster_id or "",
    )


def _state(
    settings: Settings,
    topics: dict[str, TopicFacts],
    state_topics: Iterable[str],
    problems: list[str],
) -> tuple[str | None, dict[str, dict[str, int]]]:
    """The step log's identity, and whose the newest records of each state topic are."""
    if settings.topic not in topics:
        return None, {}
    found: dict[str, dict[str, int]] = {}
    try:
        identity = str(resolve(settings))
        for topic in dict.fromkeys(state_topics):
            if topic in topics:
                found[topic] = dict(origins(settings, topic, last=STATE_SAMPLE))
    except BrokerError as exc:
        problems.append(f"cannot read whose the state records are: {exc.message}")
        return None, found
    return identity, found


def _configs(client: AdminClient, topic: str, problems: list[str]) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = client.describe_configs([resource])[resource].result(timeout=_TIMEOUT)
    except Exception as exc:  # a broker without DescribeConfigs (the dev broker)
        problems.append(f"cannot read the configs of {topic}: {_first_line(exc)}")
        return {}
    return {name: str(entry.value) for name, entry in entries.items() if entry.value is not None}


def _groups(
    client: AdminClient, ids: list[str], topics: dict[str, TopicFacts], problems: list[str]
) -> dict[str, GroupFacts]:
    if not ids:
        return {}
    try:
        listed = {g.group_id for g in client.list_consumer_groups().result(timeout=_TIMEOUT).valid}
    except Exception as exc:
        problems.append(f"cannot list consumer groups: {_first_line(exc)}")
        return {}
    found = {}
    for group_id in (g for g in ids if g in listed):
        try:
            found[group_id] = _group(client, group_id, topics)
        except Exception as exc:
            problems.append(f"cannot describe group {group_id}: {_first_line(exc)}")
    return found


def _group(client: AdminClient, group_id: str, topics: dict[str, TopicFacts]) -> GroupFacts:
    description = client.describe_consumer_groups([group_id])[group_id].result(timeout=_TIMEOUT)
    members = tuple(
        Member(
            str(m.client_id or ""),
            frozenset(tp.topic for tp in (getattr(m.assignment, "topic_partitions", None) or [])),
        )
        for m in description.members
    )
    request = [ConsumerGroupTopicPartitions(group_id)]
    committed = client.list_consumer_group_offsets(request)[group_id].result(timeout=_TIMEOUT)
    ours = [tp for tp in committed.topic_partitions if tp.topic in topics]
    ends = _ends(client, [TopicPartition(tp.topic, tp.partition) for tp in ours])
    lag: dict[str, int] = {}
    uncommitted: dict[str, int] = {}
    for tp in ours:
        if tp.offset < 0:
            uncommitted[tp.topic] = uncommitted.get(tp.topic, 0) + 1
            continue
        end = ends.get((tp.topic, tp.partition), tp.offset)
        lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - tp.offset)
    return GroupFacts(group_id, members, lag, uncommitted)


def _ends(client: AdminClient, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    asked: dict[TopicPartition, Any] = {tp: latest for tp in partitions}
    ends = {}
    for tp, future in client.list_offsets(asked).items():
        ends[(tp.topic, tp.partition)] = int(future.result(timeout=_TIMEOUT).offset)
    return ends


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

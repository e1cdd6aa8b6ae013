"""Reading what the doctor judges from Kafka: brokers, topics, their configs, groups, lag."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stepledger.checkpoints.statetopics import origins
from stepledger.config import Settings
from stepledger.doctor.access import AccessFacts
from stepledger.doctor.checks import ClusterFacts, GroupFacts, Member, TopicFacts
from stepledger.errors import BrokerError
from stepledger.fleets.permissions import fleet_names, role_permissions
from stepledger.kafka.broker import unreachable
from stepledger.kafka.describe import ClusterView
from stepledger.kafka.logid import resolve
from stepledger.kafka.provision import list_fleets
from stepledger.kafka.security import wildcard_topic_acls

_TIMEOUT = 10.0
#: The newest records read of each partition of a state topic.
STATE_SAMPLE = 1000


def gather(settings: Settings, *, checkpoint_topic: str, groups: Iterable[str]) -> ClusterFacts:
    """Read the cluster once: what a broker will not say becomes a problem, not an error."""
    cluster = ClusterView(settings)
    try:
        layout = cluster.layout(timeout=_TIMEOUT)
    except BrokerError as exc:
        raise unreachable(settings, exc.message) from None
    names = [settings.topic, settings.dlq_topic, checkpoint_topic, settings.recovery_state_topic]
    granted = _granted(settings)
    problems: list[str] = []
    topics = {}
    for name in dict.fromkeys(names):
        partitions = layout.topics.get(name)
        if not partitions:
            continue
        replicas = min(len(p.replicas) for p in partitions.values())
        may_describe = granted is None or "DESCRIBE_CONFIGS" in granted.get(name, ())
        configs = _configs(cluster, name, problems) if may_describe else {}
        topics[name] = TopicFacts(name, len(partitions), replicas, configs)
    described = _groups(cluster, list(dict.fromkeys(groups)), topics, problems)
    state_topics = (checkpoint_topic, settings.recovery_state_topic)
    identity, origins = _state(settings, topics, state_topics, problems)
    return ClusterFacts(
        brokers=layout.brokers,
        step_topic=settings.topic,
        dlq_topic=settings.dlq_topic,
        checkpoint_topic=checkpoint_topic,
        topics=topics,
        groups=described,
        problems=tuple(problems),
        identity=identity,
        state_origins=origins,
        recovery_state_topic=settings.recovery_state_topic,
        cluster_id=layout.cluster_id,
        hidden=frozenset(n for n in names if granted is not None and n not in granted),
    )


def _granted(settings: Settings) -> dict[str, set[str]] | None:
    """A fleet role's topic operations by its table (None: the settings are no role's)."""
    if settings.role is None:
        return None
    granted: dict[str, set[str]] = {}
    for permission in role_permissions(settings.fleet_id, settings.role):
        if permission.resource == "TOPIC":
            granted.setdefault(permission.name, set()).add(permission.operation)
    return granted


def gather_access(settings: Settings) -> AccessFacts | None:
    """What a fleet role's own credentials may do (None: the settings are no fleet role's).

    Its fleet's topics and every topic it can list are asked about: a topic it cannot list
    is one it can neither read nor write (both imply DESCRIBE).
    """
    if settings.role is None:
        return None
    cluster = ClusterView(settings)
    listed = {name for name in cluster.layout(timeout=_TIMEOUT).names if not name.startswith("__")}
    own = fleet_names(settings.fleet_id).topics()
    topics = cluster.topic_operations([*own, *listed], timeout=_TIMEOUT)
    operations = cluster.cluster_operations(timeout=_TIMEOUT)
    return AccessFacts(settings.fleet_id, settings.role, topics, operations)


@dataclass(frozen=True)
class Wildcards:
    """The wildcard principal's topic ACLs, the cluster's fleets and its topics."""

    acls: list[tuple[str, str, str]]
    fleets: list[str]
    topics: frozenset[str]


def gather_wildcards(settings: Settings) -> Wildcards | None:
    """What the wildcard check judges, when these settings may describe ACLs (the super
    user's); None otherwise (a fleet role, an open cluster, a principal refused)."""
    if settings.role is not None or "sasl.username" not in settings.kafka:
        return None
    try:
        acls, fleets = wildcard_topic_acls(settings), list_fleets(settings)
        listed = ClusterView(settings).layout(timeout=_TIMEOUT).names
    except BrokerError:
        return None
    return Wildcards(acls, fleets, listed)


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


def _configs(cluster: ClusterView, topic: str, problems: list[str]) -> dict[str, str]:
    try:
        return cluster.topic_configs(topic, timeout=_TIMEOUT)
    except BrokerError as exc:  # a broker without DescribeConfigs (the dev broker)
        problems.append(f"cannot read the configs of {topic}: {exc.message}")
        return {}


def _groups(
    cluster: ClusterView, ids: list[str], topics: dict[str, TopicFacts], problems: list[str]
) -> dict[str, GroupFacts]:
    if not ids:
        return {}
    try:
        listed = set(cluster.group_ids(timeout=_TIMEOUT))
    except BrokerError as exc:
        problems.append(f"cannot list consumer groups: {exc.message}")
        return {}
    found = {}
    for group_id in (g for g in ids if g in listed):
        try:
            found[group_id] = _group(cluster, group_id, topics)
        except BrokerError as exc:
            problems.append(f"cannot describe group {group_id}: {exc.message}")
    return found


def _group(cluster: ClusterView, group_id: str, topics: dict[str, TopicFacts]) -> GroupFacts:
    described = cluster.members([group_id], timeout=_TIMEOUT)[group_id]
    members = tuple(Member(m.client_id, m.topics) for m in described)
    ours = {
        w: n for w, n in cluster.committed(group_id, timeout=_TIMEOUT).items() if w[0] in topics
    }
    ends = cluster.ends(ours, timeout=_TIMEOUT)
    lag: dict[str, int] = {}
    uncommitted: dict[str, int] = {}
    for (topic, partition), offset in ours.items():
        if offset < 0:
            uncommitted[topic] = uncommitted.get(topic, 0) + 1
            continue
        end = ends.get((topic, partition), offset)
        lag[topic] = lag.get(topic, 0) + max(0, end - offset)
    return GroupFacts(group_id, members, lag, uncommitted)

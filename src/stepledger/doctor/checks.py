"""The doctor's checks: pure functions from what a cluster holds to one finding per problem.

Levels: ``unsafe`` (the guarantees do not hold: acknowledged events can be lost, history
deleted with no checkpoint covering it), ``off`` (works, but not as the deadlines, the
groups or this version expect), ``info`` (what was measured, e.g. lag) and ``ok`` (a check
that passed, and what it verified: :func:`passed`).  Only an unsafe finding makes
``stepledger doctor`` exit non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from stepledger import wire

Level = Literal["unsafe", "off", "info", "ok"]

#: The replication a multi-broker cluster needs so an acknowledged event survives a broker.
MIN_REPLICATION = 3
MIN_INSYNC = 2
#: Members of a stepledger group name their role and version in their client id.
CLIENT_PREFIX = wire.CLIENT_ID_PREFIX
#: The cluster id a Tansu broker reports by default (the development broker).
TANSU_CLUSTER = "tansu_cluster"


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report."""

    level: Level
    check: str
    subject: str
    message: str

    def to_json(self) -> dict[str, str]:
        """A JSON-ready mapping."""
        return asdict(self)


@dataclass(frozen=True)
class TopicFacts:
    """What the cluster says about one topic."""

    name: str
    partitions: int
    replication: int
    """The smallest replica count over the topic's partitions."""
    configs: Mapping[str, str] = field(default_factory=dict)
    """The topic's effective configs (empty when the broker would not describe them)."""


@dataclass(frozen=True)
class Member:
    """One member of a consumer group."""

    client_id: str
    topics: frozenset[str]


@dataclass(frozen=True)
class GroupFacts:
    """One consumer group: its members and, per topic, committed offsets behind the end."""

    group_id: str
    members: tuple[Member, ...] = ()
    lag: Mapping[str, int] = field(default_factory=dict)
    """Records behind the end per topic, over the partitions with a committed offset."""
    uncommitted: Mapping[str, int] = field(default_factory=dict)
    """Per topic, how many partitions have no committed offset."""


@dataclass(frozen=True)
class ClusterFacts:
    """Everything the checks judge, read once."""

    brokers: int
    step_topic: str
    dlq_topic: str
    checkpoint_topic: str
    topics: Mapping[str, TopicFacts]
    """The stepledger topics that exist (missing ones are absent)."""
    groups: Mapping[str, GroupFacts]
    """The groups asked about that exist."""
    problems: tuple[str, ...] = ()
    """What could not be read (a broker that does not describe configs, say)."""
    identity: str | None = None
    """The step log's identity, ``<topic>@<topic id>`` (None: not read)."""
    state_origins: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per state topic, how many of its newest records name each step log (``-``: none)."""
    recovery_state_topic: str = ""
    """The recovery changelog (the recovery daemons' state)."""
    cluster_id: str = ""
    """The cluster's id as its metadata names it (Tansu's is ``tansu_cluster``)."""
    hidden: frozenset[str] = frozenset()
    """Topics these credentials may not describe by design (a fleet role's table gives it
    none): not seeing one says nothing about whether it exists."""


def check(facts: ClusterFacts, *, version: str, max_lag: int = 10_000) -> list[Finding]:
    """Every finding about the cluster, unsafe ones first."""
    found = [
        *_missing(facts),
        *_replication(facts),
        *_retention(facts),
        *_timestamps(facts),
        *_compaction(facts),
        *_shared_state(facts),
        *_groups(facts, version, max_lag),
        *(Finding("off", "read", "cluster", problem) for problem in facts.problems),
    ]
    order = {"unsafe": 0, "off": 1, "info": 2, "ok": 3}
    return sorted(found, key=lambda f: order[f.level])


def unsafe(findings: Iterable[Finding]) -> bool:
    """Whether any finding is unsafe."""
    return any(f.level == "unsafe" for f in findings)


def _missing(facts: ClusterFacts) -> list[Finding]:
    return [
        Finding("unsafe", "topics", name, f"topic {name} does not exist (`stepledger init`)")
        for name in (facts.step_topic, facts.dlq_topic)
        if name not in facts.topics and name not in facts.hidden
    ]


def _ours(facts: ClusterFacts) -> list[TopicFacts]:
    names = (facts.step_topic, facts.dlq_topic, facts.checkpoint_topic)
    return [facts.topics[n] for n in names if n in facts.topics]


def _replication(facts: ClusterFacts) -> list[Finding]:
    if facts.brokers <= 1:
        return [
            Finding(
                "off",
                "replication",
                "cluster",
                f"{_one_copy(facts)} (fine for development; production wants "
                f"{MIN_REPLICATION} brokers, min.insync.replicas={MIN_INSYNC})",
            )
        ]
    found = []
    for topic in _ours(facts):
        if topic.replication < MIN_REPLICATION:
            found.append(
                Finding(
                    "unsafe",
                    "replication",
                    topic.name,
                    f"replication factor {topic.replication} < {MIN_REPLICATION} on a "
                    f"{facts.brokers}-broker cluster",
                )
            )
        insync = _int(topic.configs.get("min.insync.replicas"))
        if insync is not None and insync < MIN_INSYNC:
            found.append(
                Finding(
                    "unsafe",
                    "replication",
                    topic.name,
                    f"min.insync.replicas={insync} < {MIN_INSYNC}: acks=all is acknowledged "
                    "by one broker alone",
                )
            )
    return found


def _one_copy(facts: ClusterFacts) -> str:
    """Where a one-broker cluster keeps the only copy of an acknowledged event."""
    if facts.cluster_id.startswith(TANSU_CLUSTER):
        return (
            "one Tansu broker (the development broker, `stepledger broker`): every "
            "acknowledged event has one copy, in the broker's memory unless it was started "
            "with S3 storage; it is lost when the broker stops"
        )
    return (
        "one broker: every acknowledged event has one copy, on that broker's disk "
        "(acknowledged from its page cache, before an fsync)"
    )


def _retention(facts: ClusterFacts) -> list[Finding]:
    topic = facts.topics.get(facts.step_topic)
    if topic is None or not topic.configs:
        return []
    limits = {
        key: value
        for key in ("retention.ms", "retention.bytes")
        if (value := _int(topic.configs.get(key))) is not None and value >= 0
    }
    if not limits:
        return []
    shown = ", ".join(f"{k}={v}" for k, v in limits.items())
    if facts.checkpoint_topic in facts.topics:
        return [
            Finding(
                "info",
                "retention",
                topic.name,
                f"finite retention ({shown}); checkpoints on {facts.checkpoint_topic}",
            )
        ]
    return [
        Finding(
            "unsafe",
            "retention",
            topic.name,
            f"finite retention ({shown}) and no checkpoint topic {facts.checkpoint_topic}: the "
            "broker deletes the only copy of workflows' history (set retention.ms=-1 and "
            "retention.bytes=-1)",
        )
    ]


def _timestamps(facts: ClusterFacts) -> list[Finding]:
    topic = facts.topics.get(facts.step_topic)
    kind = None if topic is None else topic.configs.get("message.timestamp.type")
    if kind is None or kind == wire.STEP_LOG_TIMESTAMP_TYPE:
        return []
    return [
        Finding(
            "off",
            "timestamps",
            facts.step_topic,
            f"message.timestamp.type={kind}, deadlines expect {wire.STEP_LOG_TIMESTAMP_TYPE}",
        )
    ]


def _compaction(facts: ClusterFacts) -> list[Finding]:
    topic = facts.topics.get(facts.checkpoint_topic)
    if topic is None or not topic.configs:
        return []
    policy = topic.configs.get("cleanup.policy", "")
    if "compact" in policy.split(","):
        return []
    return [
        Finding(
            "unsafe",
            "compaction",
            topic.name,
            f"cleanup.policy={policy or '?'}: a checkpoint topic must be compacted, or its "
            "retention deletes checkpoints",
        )
    ]


def _shared_state(facts: ClusterFacts) -> list[Finding]:
    """State topics holding another step log's records (or none's), groups reading others."""
    found = []
    for topic, named in sorted(facts.state_origins.items()):
        others = {n: c for n, c in named.items() if n not in ("-", facts.identity)}
        if others:
            shown = ", ".join(f"{n} ({c})" for n, c in sorted(others.items()))
            found.append(
                Finding(
                    "unsafe",
                    "shared",
                    topic,
                    f"holds records of other step logs among its newest: {shown}; two "
                    "deployments share it and compaction keeps one record per key for both "
                    "(one log's checkpoint or progress deletes the other's); readers refuse "
                    "the other log's records; give each step log its own (the default is "
                    "named after the step log)",
                )
            )
        if named.get("-"):
            found.append(
                Finding(
                    "off",
                    "shared",
                    topic,
                    f"{named['-']} of its newest records name no step log (written before "
                    "0.4.0, or not by stepledger): readers refuse them; `stepledger init "
                    "--adopt-unnamed-state` names this log's (see the CHANGELOG)",
                )
            )
    for group in facts.groups.values():
        read = sorted({t for m in group.members for t in m.topics} - {facts.step_topic})
        if read:
            found.append(
                Finding(
                    "off",
                    "shared",
                    group.group_id,
                    f"members also read {', '.join(read)}: a group shared by deployments "
                    "rebalances them together (the default group is named after the step log)",
                )
            )
    return found


def _groups(facts: ClusterFacts, version: str, max_lag: int) -> list[Finding]:
    found: list[Finding] = []
    for group in facts.groups.values():
        found += _members(facts, group)
        found += _versions(group, version)
        found += _lag(group, max_lag)
    return found


def _members(facts: ClusterFacts, group: GroupFacts) -> list[Finding]:
    # A member beyond the partitions gets none: it is idle (a group member does not say what
    # it subscribed to, only what it was given).
    idle = [m for m in group.members if not m.topics]
    busy = sorted({t for m in group.members for t in m.topics})
    if not idle or not busy:
        return []
    partitions = sum(facts.topics[t].partitions for t in busy if t in facts.topics)
    return [
        Finding(
            "off",
            "members",
            group.group_id,
            f"{len(group.members)} members, {len(idle)} without a partition: "
            f"{', '.join(busy)} has {partitions} partition(s) (more partitions, or fewer members)",
        )
    ]


def _versions(group: GroupFacts, version: str) -> list[Finding]:
    others = sorted(
        {
            m.client_id
            for m in group.members
            if m.client_id.startswith(CLIENT_PREFIX) and _version_of(m.client_id) != version
        }
    )
    if not others:
        return []
    return [
        Finding(
            "off",
            "versions",
            group.group_id,
            f"member(s) of another version than {version}: {', '.join(others)}",
        )
    ]


def _version_of(client_id: str) -> str | None:
    _, sep, version = client_id.partition("/")
    return version or None if sep else None


def _lag(group: GroupFacts, max_lag: int) -> list[Finding]:
    found = []
    for topic in sorted({*group.lag, *group.uncommitted}):
        lag, missing = group.lag.get(topic, 0), group.uncommitted.get(topic, 0)
        note = f"; {missing} partition(s) without a committed offset" if missing else ""
        level: Level = "off" if lag > max_lag else "info"
        found.append(Finding(level, "lag", group.group_id, f"lag {lag} on {topic}{note}"))
    if not found:
        found.append(Finding("info", "lag", group.group_id, "no committed offsets"))
    return found


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None

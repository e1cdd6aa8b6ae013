"""What the doctor checked and found in order (pure): a report of findings alone reads the
same for a healthy cluster and for one the doctor could not look at.

Each check that raised nothing unsafe or off, and that had something to look at, gives one
``ok`` line naming what it verified; a check with nothing to look at (no checkpoint topic,
configs the broker would not describe, no group) says so instead, so silence never stands
for a pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepledger import wire
from stepledger.doctor.checks import (
    MIN_INSYNC,
    MIN_REPLICATION,
    ClusterFacts,
    Finding,
)

CHECKS = (
    "topics",
    "replication",
    "retention",
    "timestamps",
    "compaction",
    "shared",
    "members",
    "versions",
    "lag",
    "read",
)
"""Every check the doctor runs, in the order it reports them."""


def passed(facts: ClusterFacts, findings: Sequence[Finding]) -> list[Finding]:
    """One ``ok`` line per check that passed (what it verified) or ``info`` if it had nothing
    to look at; checks with an unsafe or off finding are left to their findings."""
    failing = {(f.check, f.subject) for f in findings if f.level in ("unsafe", "off")}
    failed = {check for check, _ in failing}
    lines = [*_topics(facts), *_replication(facts), *_step_log(facts), *_compaction(facts)]
    lines += _shared(facts)
    lines += _groups(facts)
    if not facts.problems:
        lines.append(_ok("read", "cluster", "the brokers described every topic and group asked"))
    # A cluster-wide line passes only if no subject of its check failed; a group's, if its own.
    return [f for f in lines if (f.check, f.subject) not in failing and not _any(f, failed)]


def _any(line: Finding, failed: set[str]) -> bool:
    """A cluster-wide line whose check failed for some subject."""
    return line.subject == "cluster" and line.check in failed


def _ok(check: str, subject: str, message: str) -> Finding:
    return Finding("ok", check, subject, message)


def _topics(facts: ClusterFacts) -> list[Finding]:
    return [_ok("topics", "cluster", f"{facts.step_topic} and {facts.dlq_topic} exist")]


def _replication(facts: ClusterFacts) -> list[Finding]:
    names = (facts.step_topic, facts.dlq_topic, facts.checkpoint_topic)
    present = [n for n in dict.fromkeys(names) if n in facts.topics]
    if facts.brokers <= 1 or not present:
        return []
    return [
        _ok(
            "replication",
            "cluster",
            f"{facts.brokers} brokers; {', '.join(present)}: replication factor >= "
            f"{MIN_REPLICATION}, min.insync.replicas >= {MIN_INSYNC} (where described)",
        )
    ]


def _step_log(facts: ClusterFacts) -> list[Finding]:
    topic = facts.topics.get(facts.step_topic)
    if topic is None:
        return []
    if not topic.configs:
        note = "its configs were not described: retention and timestamps not checked"
        return [Finding("info", "retention", topic.name, note)]
    found = []
    kept = [k for k in ("retention.ms", "retention.bytes") if topic.configs.get(k) in (None, "-1")]
    if len(kept) == 2:
        found.append(_ok("retention", topic.name, "keeps everything (retention.ms=-1, bytes=-1)"))
    if topic.configs.get("message.timestamp.type") == wire.STEP_LOG_TIMESTAMP_TYPE:
        found.append(_ok("timestamps", topic.name, f"stamped {wire.STEP_LOG_TIMESTAMP_TYPE}"))
    return found


def _compaction(facts: ClusterFacts) -> list[Finding]:
    topic = facts.topics.get(facts.checkpoint_topic)
    if topic is None:
        return [Finding("info", "compaction", facts.checkpoint_topic, "no checkpoint topic")]
    if not topic.configs:
        return []
    return [_ok("compaction", topic.name, "compacted (cleanup.policy has compact)")]


def _shared(facts: ClusterFacts) -> list[Finding]:
    if not facts.state_origins and not facts.groups:
        return []
    looked = [*sorted(facts.state_origins), *sorted(facts.groups)]
    return [_ok("shared", "cluster", f"{', '.join(looked)} serve this step log alone")]


def _groups(facts: ClusterFacts) -> list[Finding]:
    if not facts.groups:
        return [Finding("info", "members", "cluster", "none of the groups asked about exists")]
    found = []
    for group in facts.groups.values():
        count = len(group.members)
        found.append(_ok("members", group.group_id, f"{count} member(s), none idle"))
        if count:
            found.append(_ok("versions", group.group_id, "every member runs this version"))
    return found

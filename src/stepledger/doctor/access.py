"""The doctor's access checks (pure): a fleet role against its permission table, and ACLs
that let any principal write a fleet's topics.

With a role's own credentials the broker says what that principal may do on each topic and
on the cluster (KIP-430 authorised operations, nothing written or read to find out).  The role
must hold what :func:`~stepledger.fleets.role_permissions` gives it on its fleet's topics, and
nothing that lets it touch what it must not: another fleet's topics (READ or WRITE on any topic
it can see outside its fleet; seeing one is no harm), its own fleet's topics beyond its table,
or the cluster (ACLs, quotas, topics).  Each line is a :class:`~stepledger.doctor.checks.Finding`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stepledger.doctor.checks import Finding
from stepledger.fleets.permissions import Role, fleet_names, role_permissions

ACCESS, ACLS = "access", "acls"
#: Operations that change or read data: held beyond the table, each one is unsafe.
_FORBIDDEN = frozenset({"READ", "WRITE", "DELETE", "ALTER", "ALTER_CONFIGS", "CREATE", "ALL"})
#: Cluster operations no fleet role may hold (ALTER: ACLs; ALTER_CONFIGS: quotas and broker
#: settings; CREATE: topics anywhere; CLUSTER_ACTION: a broker's own requests).
_CLUSTER_FORBIDDEN = frozenset({"ALTER", "ALTER_CONFIGS", "CREATE", "CLUSTER_ACTION", "ALL"})
#: What the broker implies with an operation (a READ or WRITE grant lets a topic be described).
_IMPLIED = {"READ": "DESCRIBE", "WRITE": "DESCRIBE", "DELETE": "DESCRIBE", "ALTER": "DESCRIBE"}


@dataclass(frozen=True)
class AccessFacts:
    """What the broker said a fleet role's own credentials may do."""

    fleet: str
    role: Role
    topics: Mapping[str, frozenset[str] | None]
    """The fleet's topics and every topic the role can list: its operations (None: refused)."""
    cluster: frozenset[str]


def access_findings(facts: AccessFacts) -> list[Finding]:
    """One line per missing or excess permission, and ``ok`` lines for what held."""
    subject = f"{facts.fleet} {facts.role}"
    needed = _needed(facts.fleet, facts.role)
    own = set(fleet_names(facts.fleet).topics())
    lacks: list[str] = []
    excess: list[str] = []
    for topic in sorted(needed):
        if missing := sorted(needed[topic] - (facts.topics.get(topic) or frozenset())):
            lacks.append(f"lacks {', '.join(missing)} on TOPIC {topic}")
    for topic, held in sorted(facts.topics.items()):
        allowed = needed.get(topic, frozenset())
        extra = (held or frozenset()) - allowed - {_IMPLIED.get(op, op) for op in allowed}
        if bad := sorted(op for op in extra if op in _FORBIDDEN):
            whose = "its own fleet, beyond its table" if topic in own else "another fleet"
            excess.append(f"may {', '.join(bad)} TOPIC {topic} of {whose}")
    if cluster := sorted(facts.cluster & _CLUSTER_FORBIDDEN):
        excess.append(f"may {', '.join(cluster)} the CLUSTER (ACLs, quotas, topics)")
    found = [_unsafe(subject, f"{line}: it cannot do its job") for line in lacks]
    found += [_unsafe(subject, f"{line}: a fleet role must not") for line in excess]
    if not lacks:
        found.append(_ok(ACCESS, subject, f"holds what its table says on {', '.join(needed)}"))
    if not excess:
        found.append(
            _ok(ACCESS, subject, "can touch no other fleet's topic nor alter ACLs or quotas")
        )
    return found


def wildcard_findings(
    acls: Iterable[tuple[str, str, str]], fleets: Iterable[str], topics: Iterable[str]
) -> list[Finding]:
    """An ``unsafe`` line per fleet whose topics any principal (``User:*``) may write."""
    writes = [(n, p, o) for n, p, o in acls if o in ("WRITE", "ALL")]
    listed = sorted(set(topics))
    found = []
    for fleet in sorted(set(fleets)):
        names = set(fleet_names(fleet).topics())
        for name, pattern, operation in writes:
            covered = [t for t in listed if t in names and _matches(t, name, pattern)]
            if covered:
                acl = f"User:* {operation} TOPIC {name}" + (" (prefix)" * (pattern == "PREFIXED"))
                line = f"any principal may write {', '.join(covered)} (ACL {acl})"
                found.append(_unsafe(f"fleet {fleet}", line, check=ACLS))
    if not found:
        found.append(_ok(ACLS, "cluster", "no ACL lets any principal write a fleet's topic"))
    return found


def _matches(topic: str, name: str, pattern: str) -> bool:
    if pattern == "PREFIXED":
        return topic.startswith(name)
    return name in ("*", topic)


def _needed(fleet: str, role: Role) -> dict[str, frozenset[str]]:
    needed: dict[str, set[str]] = {}
    for permission in role_permissions(fleet, role):
        if permission.resource == "TOPIC":
            needed.setdefault(permission.name, set()).add(permission.operation)
    return {topic: frozenset(ops) for topic, ops in needed.items()}


def _ok(check: str, subject: str, message: str) -> Finding:
    return Finding("ok", check, subject, message)


def _unsafe(subject: str, message: str, check: str = ACCESS) -> Finding:
    return Finding("unsafe", check, subject, message)

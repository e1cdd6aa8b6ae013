"""What each role of a fleet may do on the broker: the permission table, as data.

A fleet NAME has its step log ``NAME`` and every state topic and consumer group derived from
it (``NAME.checkpoints``, ``NAME.recovery``; :func:`stepledger.wire.derived_name`).  A fleet
name has no ``.``, so the prefix ``NAME.`` covers this fleet's derived names and no other
fleet's: fleet ``a``'s prefix ``a.`` never matches fleet ``ab``'s names, nor can a fleet be
named ``a.x`` and fall under it.

Each role's principal is ``User:NAME.<role>``; it gets exactly the operations its processes
were seen to need on a broker that allows nothing by default (``tests/integration/
test_fleets.py`` runs each role with only these and a hostile client with another fleet's).
Topics are named literally (an agent may write the step log, not the checkpoints beside it);
groups by the fleet's prefix for DESCRIBE (every reader's assigned ``group.id``) and
literally for READ (only a daemon's own group commits offsets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from stepledger import wire
from stepledger.errors import ConfigError

Role = Literal["agent", "projector", "recovery", "checkpointer", "inbox"]
"""A fleet's roles, each a principal of its own."""
ROLES: tuple[Role, ...] = get_args(Role)
Operation = Literal["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"]
"""The Kafka ACL operations a fleet's roles are given (never CREATE, DELETE, ALTER)."""
Resource = Literal["TOPIC", "GROUP"]
Pattern = Literal["LITERAL", "PREFIXED"]

#: A fleet name: a Kafka topic name without ``.`` (the separator of derived names).
_FLEET_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")


@dataclass(frozen=True, order=True)
class Permission:
    """One ALLOW ACL: a principal may do ``operation`` on a resource, from any host."""

    principal: str
    """``User:<name>``."""
    resource: Resource
    name: str
    """The resource's name, or its prefix when ``pattern`` is PREFIXED."""
    pattern: Pattern
    operation: Operation

    def describe(self) -> str:
        """One line, as an operator reads an ACL (``User:a.agent WRITE TOPIC a``)."""
        prefix = " (prefix)" if self.pattern == "PREFIXED" else ""
        return f"{self.principal} {self.operation} {self.resource} {self.name}{prefix}"


@dataclass(frozen=True)
class FleetNames:
    """A fleet's step log and the topics and groups derived from it."""

    fleet: str
    step_log: str
    dead_letters: str
    checkpoints: str
    recovery_state: str
    budget: str
    """The one-partition topic that orders the fleet's model spends."""
    prefix: str
    """What every derived name starts with (the ACL prefix of the fleet's groups)."""

    def topics(self) -> tuple[str, ...]:
        """Every topic of the fleet, step log first."""
        return (
            self.step_log,
            self.dead_letters,
            self.checkpoints,
            self.recovery_state,
            self.budget,
        )

    def group(self, role: str) -> str:
        """The fleet's consumer group for ``role`` (a ``wire.*_ROLE``)."""
        return wire.derived_name(self.step_log, role)


def validate_fleet_name(name: str) -> str:
    """``name`` if it can name a fleet (a topic name without ``.``), else ConfigError."""
    if not _FLEET_NAME.fullmatch(name):
        raise ConfigError(
            f"{name!r} cannot name a fleet: 1-100 of a-z A-Z 0-9 _ - (no '.', which "
            "separates a fleet's derived names and would put one fleet under another's prefix)"
        )
    return name


def fleet_names(name: str) -> FleetNames:
    """The names of fleet ``name``'s topics and groups."""
    log = validate_fleet_name(name)
    return FleetNames(
        fleet=log,
        step_log=log,
        dead_letters=wire.derived_name(log, wire.DEAD_LETTER_ROLE),
        checkpoints=wire.derived_name(log, wire.CHECKPOINT_ROLE),
        recovery_state=wire.derived_name(log, wire.RECOVERY_STATE_ROLE),
        budget=wire.derived_name(log, wire.BUDGET_ROLE),
        prefix=f"{log}{wire.DERIVED_NAME_SEPARATOR}",
    )


def principal(fleet: str, role: Role) -> str:
    """The SCRAM user name of ``role`` in ``fleet`` (its principal is ``User:`` this)."""
    return f"{validate_fleet_name(fleet)}{wire.DERIVED_NAME_SEPARATOR}{role}"


#: What each role does on each of its fleet's topics (by FleetNames field) and which of the
#: fleet's groups it joins (READ: joins it, and commits offsets there).  Why each one is needed:
#: WRITE on the step log: intents and outcomes (agent), decisions (recovery), answers (inbox);
#: READ on checkpoints: a workflow opened or restored below the log's start;
#: DESCRIBE: metadata, watermarks, the topic id of the log identity (without it a topic
#: looks missing); DESCRIBE_CONFIGS: the step log's size limit and retention, read at start;
#: WRITE and READ on the budget topic: a turn's reservation appended and read back (agent),
#: a person's raise of the fleet's budget (inbox).
_TOPICS: dict[Role, dict[str, tuple[Operation, ...]]] = {
    "agent": {
        "step_log": ("WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
        "checkpoints": ("READ", "DESCRIBE"),
        "budget": ("WRITE", "READ", "DESCRIBE"),
    },
    "projector": {
        "step_log": ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
        "dead_letters": ("WRITE", "DESCRIBE"),
        "checkpoints": ("READ", "DESCRIBE"),
    },
    "recovery": {
        "step_log": ("WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
        "dead_letters": ("WRITE", "DESCRIBE"),
        "checkpoints": ("READ", "DESCRIBE"),
        "recovery_state": ("WRITE", "READ", "DESCRIBE"),
    },
    "checkpointer": {
        "step_log": ("READ", "DESCRIBE"),
        "checkpoints": ("WRITE", "READ", "DESCRIBE"),
    },
    "inbox": {
        "step_log": ("WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
        "checkpoints": ("READ", "DESCRIBE"),
        "budget": ("WRITE", "READ", "DESCRIBE"),
    },
}
_GROUPS: dict[Role, tuple[str, ...]] = {
    "projector": (wire.PROJECTOR_ROLE, wire.LAKE_PROJECTOR_ROLE),
    "recovery": (wire.RECOVERY_ROLE,),
    "checkpointer": (wire.CHECKPOINTER_ROLE,),
}


def role_permissions(fleet: str, role: Role) -> list[Permission]:
    """Every ACL ``role`` of ``fleet`` needs, and nothing more."""
    names = fleet_names(fleet)
    user = f"User:{principal(fleet, role)}"
    found = [
        Permission(user, "TOPIC", getattr(names, field), "LITERAL", operation)
        for field, operations in _TOPICS[role].items()
        for operation in operations
    ]
    found.append(Permission(user, "GROUP", names.prefix, "PREFIXED", "DESCRIBE"))
    found += [
        Permission(user, "GROUP", names.group(group), "LITERAL", "READ")
        for group in _GROUPS.get(role, ())
    ]
    return found


def fleet_permissions(fleet: str) -> list[Permission]:
    """Every ACL of every role of ``fleet``."""
    return [p for role in ROLES for p in role_permissions(fleet, role)]

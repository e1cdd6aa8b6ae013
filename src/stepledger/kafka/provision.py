"""A fleet made, shown and removed with the super user's settings; each role's config file.

``create`` makes the fleet's topics (the step log keeps everything, the state topics are
compacted and partitioned like it, the budget topic has one partition and keeps everything),
one SCRAM user per role with a random password, and each role's ACLs
(:mod:`~stepledger.fleets.permissions`) and the fleet's quota on each role's user
(:mod:`~stepledger.fleets.quotas`), then writes one config file per role,
owner-only.  Running it again for an existing fleet gives each role a new password and keeps
the topics: the old config files stop working, which is how an operator rotates them.
``upgrade`` brings an existing fleet's topics and ACLs to what this release needs (a new
topic, a new ACL) and touches no user, password, config file or quota: running agents and
daemons keep their credentials through it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stepledger.config import Settings, config_text, write_private
from stepledger.errors import ConfigError
from stepledger.fleets.permissions import (
    ROLES,
    FleetNames,
    Permission,
    Role,
    fleet_names,
    principal,
    role_permissions,
)
from stepledger.fleets.quotas import Quota, fleet_users
from stepledger.kafka import ensure_topics, listed_topics, topic_partitions
from stepledger.kafka.quotas import alter_user_quotas, user_quotas
from stepledger.kafka.security import (
    acls_of,
    create_acls,
    delete_acls,
    delete_scram_user,
    scram_users,
    upsert_scram_user,
)
from stepledger.kafka.topics import COMPACTED, ensure_budget_topic, step_log_config

#: Settings of the super user's config that no role's config copies (its identity).
_ADMIN_IDENTITY = frozenset({"sasl.username", "sasl.password"})


@dataclass(frozen=True)
class RoleConfig:
    """One role's config file, written."""

    role: Role
    user: str
    path: Path


def create_fleet(
    admin: Settings, name: str, out: Path, partitions: int = 3, quota: Quota | None = None
) -> list[RoleConfig]:
    """Create fleet ``name``'s topics, users, ACLs and quota (default: :class:`Quota`'s);
    write each role's config into ``out``."""
    names = fleet_names(name)
    _ensure_fleet_topics(admin, names, partitions)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for role in ROLES:
        user = principal(name, role)
        password = secrets.token_urlsafe(24)
        upsert_scram_user(admin, user, password)
        create_acls(admin, role_permissions(name, role))
        path = write_private(out / f"{name}-{role}.toml", role_config(admin, names, role, password))
        written.append(RoleConfig(role, user, path))
    set_fleet_quota(admin, name, quota or Quota())
    return written


def upgrade_fleet(admin: Settings, name: str) -> list[Permission]:
    """Make the topics and ACLs fleet ``name``'s roles need now; return the ACLs added.

    Users, passwords, config files and quotas stay as they are.  A fleet whose users the
    broker does not hold is refused (``create`` makes one).
    """
    if name not in list_fleets(admin):
        raise ConfigError(f"no fleet {name!r} on this cluster: stepledger fleet create makes one")
    names = fleet_names(name)
    partitions = len(listed_topics(admin).get(names.step_log, [])) or 3
    _ensure_fleet_topics(admin, names, partitions)
    added = []
    for role in ROLES:
        needed = role_permissions(name, role)
        held = set(acls_of(admin, f"User:{principal(name, role)}"))
        missing = [permission for permission in needed if permission not in held]
        create_acls(admin, missing)
        added.extend(missing)
    return added


def set_fleet_quota(admin: Settings, name: str, quota: Quota) -> None:
    """Hold each of fleet ``name``'s users to ``quota`` (a None rate: no limit)."""
    alter_user_quotas(admin, dict.fromkeys(fleet_users(name), quota))


def change_fleet_quota(
    admin: Settings, name: str, changes: Mapping[str, float | None]
) -> dict[str, Quota]:
    """Replace the rates ``changes`` names on each of fleet ``name``'s users, keep the others
    as the broker holds them; return each user's quota as set."""
    held = fleet_quotas(admin, name)
    quotas = {user: Quota.held(rates).changed(changes) for user, rates in held.items()}
    alter_user_quotas(admin, quotas)
    return quotas


def fleet_quotas(admin: Settings, name: str) -> dict[str, dict[str, float]]:
    """The quota the broker holds for each of fleet ``name``'s users (empty: no limit)."""
    held = user_quotas(admin)
    return {user: held.get(user, {}) for user in fleet_users(name)}


def role_config(admin: Settings, names: FleetNames, role: Role, password: str) -> str:
    """The config file (TOML) of ``role``: bootstrap, the fleet's names, its credentials."""
    values = {
        "bootstrap": admin.bootstrap,
        "fleet_id": names.fleet,
        "role": role,
        "topic": names.step_log,
        "dlq_topic": names.dead_letters,
        "checkpoint_topic": names.checkpoints,
        "recovery_state_topic": names.recovery_state,
        "budget_topic": names.budget,
    }
    kafka = {k: v for k, v in admin.kafka.items() if k not in _ADMIN_IDENTITY}
    kafka.update({"sasl.username": principal(names.fleet, role), "sasl.password": password})
    return config_text(values, kafka)


def fleet_acls(admin: Settings, name: str) -> dict[Role, list[Permission]]:
    """The ACLs the broker holds for each role of fleet ``name``."""
    return {role: acls_of(admin, f"User:{principal(name, role)}") for role in ROLES}


def list_fleets(admin: Settings) -> list[str]:
    """Every fleet with at least one role's user on the broker, sorted."""
    suffixes = tuple(f".{role}" for role in ROLES)
    found = {user.rsplit(".", 1)[0] for user in scram_users(admin) if user.endswith(suffixes)}
    return sorted(found)


def delete_fleet(admin: Settings, name: str) -> None:
    """Remove fleet ``name``'s users, ACLs and quotas (its topics stay: they hold its history)."""
    set_fleet_quota(admin, name, Quota(None, None, None))
    for role in ROLES:
        delete_acls(admin, role_permissions(name, role))
        delete_scram_user(admin, principal(name, role))


def _ensure_fleet_topics(admin: Settings, names: FleetNames, partitions: int) -> None:
    ensure_topics(
        admin,
        [names.step_log, names.dead_letters],
        partitions=partitions,
        configs={names.step_log: step_log_config(checkpoints=True)},
    )
    count = len(topic_partitions(admin, names.step_log))
    state = [names.checkpoints, names.recovery_state]
    ensure_topics(admin, state, partitions=count, configs={t: dict(COMPACTED) for t in state})
    ensure_budget_topic(admin, names.budget)

"""Fleets: units of isolation the broker enforces (principals, prefixed ACLs, own topics).

:mod:`~stepledger.fleets.permissions` says what each role of a fleet may do, as data (pure,
below the Kafka adapter that applies it); :mod:`stepledger.kafka.provision` creates, lists, shows
and deletes a fleet with the super user's settings and writes each role's config file.
"""

from __future__ import annotations

from stepledger.fleets.permissions import (
    ROLES,
    Permission,
    Role,
    fleet_names,
    fleet_permissions,
    principal,
    role_permissions,
    validate_fleet_name,
)

__all__ = [
    "ROLES",
    "Permission",
    "Role",
    "fleet_names",
    "fleet_permissions",
    "principal",
    "role_permissions",
    "validate_fleet_name",
]

"""Principals and ACLs through the admin API: SCRAM users, ALLOW ACLs (the super user's work).

Every answer is plain data (the library's :class:`~stepledger.fleets.Permission`) and every
failure a :class:`~stepledger.errors.BrokerError` with the client's first line.  A password
goes to the broker and nowhere else: it is in no message, log line or exception.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.fleets.permissions import Permission
from stepledger.kafka.broker import admin, client_error, unreachable

#: SCRAM iterations of every user made here (the broker's minimum is 4096).
SCRAM_ITERATIONS = 8192
_TIMEOUT_S = 10.0


def upsert_scram_user(settings: Settings, user: str, password: str) -> None:
    """Create ``user`` (or set its password) with SCRAM-SHA-512 credentials."""
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    change = UserScramCredentialUpsertion(user, info, password.encode())
    client = admin(settings)  # held while its futures wait: a collected client cancels them
    _wait(settings, client.alter_user_scram_credentials([change]), f"set user {user}")


def delete_scram_user(settings: Settings, user: str) -> None:
    """Remove ``user``'s SCRAM-SHA-512 credentials (a missing user is no error)."""
    change = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
    client = admin(settings)
    futures = client.alter_user_scram_credentials([change])
    for future in futures.values():
        try:
            future.result(_TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:
            if "RESOURCE_NOT_FOUND" not in str(exc) and "does not exist" not in str(exc):
                raise _failed(settings, exc, f"delete user {user}") from None


def scram_users(settings: Settings) -> list[str]:
    """Every user with SCRAM credentials, sorted."""
    try:
        client = admin(settings)
        described = client.describe_user_scram_credentials()
        assert not isinstance(described, dict), "asked for every user: one future"
        found = described.result(_TIMEOUT_S)
    except (KafkaException, TimeoutError) as exc:
        raise _failed(settings, exc, "list users") from None
    return sorted(found)


def create_acls(settings: Settings, permissions: Iterable[Permission]) -> None:
    """Create an ALLOW ACL for each permission (an existing one is kept as it is)."""
    bindings = [_binding(p) for p in permissions]
    if bindings:
        client = admin(settings)
        _wait(settings, client.create_acls(bindings, request_timeout=_TIMEOUT_S), "create ACLs")


def delete_acls(settings: Settings, permissions: Iterable[Permission]) -> None:
    """Delete the ALLOW ACLs that match these permissions exactly."""
    filters = [_acl_filter(p) for p in permissions]
    if filters:
        client = admin(settings)
        _wait(settings, client.delete_acls(filters, request_timeout=_TIMEOUT_S), "delete ACLs")


def acls_of(settings: Settings, principal: str) -> list[Permission]:
    """Every ALLOW ACL the broker holds for ``principal`` (``User:<name>``), sorted."""
    query = AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]  # any name: the client's stubs say str
        ResourcePatternType.ANY,
        principal,
        None,  # type: ignore[arg-type]  # any host
        AclOperation.ANY,
        AclPermissionType.ALLOW,
    )
    try:
        client = admin(settings)
        found = client.describe_acls(query, request_timeout=_TIMEOUT_S).result(_TIMEOUT_S)
    except (KafkaException, TimeoutError) as exc:
        raise _failed(settings, exc, "describe ACLs") from None
    return sorted(
        Permission(
            b.principal,
            b.restype.name,
            b.name,
            b.resource_pattern_type.name,
            b.operation.name,
        )
        for b in found
        if b.restype.name in ("TOPIC", "GROUP") and b.operation.name in _OPERATIONS
    )


def wildcard_topic_acls(settings: Settings) -> list[tuple[str, str, str]]:
    """Every ALLOW ACL of the wildcard principal ``User:*`` on topics, as (topic name or
    prefix, pattern ``LITERAL``/``PREFIXED``, operation); the super user's question."""
    query = AclBindingFilter(
        ResourceType.TOPIC,
        None,  # type: ignore[arg-type]  # any name: the client's stubs say str
        ResourcePatternType.ANY,
        "User:*",
        None,  # type: ignore[arg-type]  # any host
        AclOperation.ANY,
        AclPermissionType.ALLOW,
    )
    try:
        client = admin(settings)
        found = client.describe_acls(query, request_timeout=_TIMEOUT_S).result(_TIMEOUT_S)
    except (KafkaException, TimeoutError) as exc:
        raise _failed(settings, exc, "describe ACLs") from None
    return sorted((b.name, b.resource_pattern_type.name, b.operation.name) for b in found)


_OPERATIONS = frozenset({"READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"})


def _binding(permission: Permission) -> AclBinding:
    return AclBinding(*_acl_args(permission))


def _acl_filter(permission: Permission) -> AclBindingFilter:
    return AclBindingFilter(*_acl_args(permission))


def _acl_args(permission: Permission) -> tuple[Any, ...]:
    """A binding's fields and a filter's are the same: the permission, from any host."""
    return (
        ResourceType[permission.resource],
        permission.name,
        ResourcePatternType[permission.pattern],
        permission.principal,
        "*",
        AclOperation[permission.operation],
        AclPermissionType.ALLOW,
    )


def _wait(settings: Settings, futures: object, what: str) -> None:
    items = futures.values() if isinstance(futures, dict) else futures
    for future in items:  # type: ignore[attr-defined]
        try:
            future.result(_TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:
            raise _failed(settings, exc, what) from None


def _failed(settings: Settings, exc: BaseException, what: str) -> BrokerError:
    """A request that failed: refused, or no answer (which may be a refused login)."""
    if isinstance(exc, TimeoutError) or (client_error(exc) or "").startswith(_NO_ANSWER):
        return unreachable(settings, f"no answer to {what} within {_TIMEOUT_S:g}s")
    return BrokerError(f"cannot {what}: {client_error(exc)}", retryable=False)


#: How librdkafka words a request that found no broker to answer it.
_NO_ANSWER = ("Local: Broker transport failure", "Local: Timed out", "Local: Authentication")

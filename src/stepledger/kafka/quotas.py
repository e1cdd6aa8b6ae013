"""Client quotas of users through the admin API (KIP-546), the super user's work.

librdkafka has no quota requests yet, so both go over :mod:`~stepledger.kafka.wireclient`
(one logged-in connection, version 0 of each request, which Kafka 2.6 through 4.x answer).
A KRaft broker forwards the change to the controller; a refused one is the one line of every
refusal, naming ALTER_CONFIGS on the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from stepledger.config import Settings
from stepledger.errors import BrokerError, NotAuthorisedError
from stepledger.fleets.quotas import Quota
from stepledger.kafka.identity import who
from stepledger.kafka.wireclient import Connection, Reader, Writer

_DESCRIBE_CLIENT_QUOTAS, _ALTER_CLIENT_QUOTAS = 48, 49
_CLUSTER_AUTHORIZATION_FAILED = 31
_USER = "user"
_MATCH_ANY = 2


def alter_user_quotas(settings: Settings, quotas: Mapping[str, Quota]) -> None:
    """Set each user's quota (a None rate removes that limit), in one request."""
    body = Writer().int32(len(quotas))
    for user, quota in quotas.items():
        body.int32(1).string(_USER)
        body.string(user)
        rates = quota.items(with_none=True)
        body.int32(len(rates))
        for key, value in rates:
            body.string(key).float64(value or 0.0).int8(value is None)
    body.int8(0)  # validate_only: false
    with Connection(settings) as connection:
        answer = connection.request(_ALTER_CLIENT_QUOTAS, 0, body.build())
    answer.int32()  # throttle time: an admin's rare request waits it out in the broker
    for entry in answer.array(_alter_entry):
        code, message, named = cast(tuple[int, str | None, str | None], entry)
        if code == _CLUSTER_AUTHORIZATION_FAILED:
            raise _refused(settings, "alter")
        if code != 0:
            raise BrokerError(f"cannot set the quota of user {named}: {message or code}")


def user_quotas(settings: Settings) -> dict[str, dict[str, float]]:
    """Every user's own quota the broker holds (no default or client-id ones), by user."""
    body = Writer().int32(1).string(_USER).int8(_MATCH_ANY).string(None).int8(1).build()
    with Connection(settings) as connection:
        answer = connection.request(_DESCRIBE_CLIENT_QUOTAS, 0, body)
    answer.int32()
    code, message = answer.int16(), answer.string()
    if code == _CLUSTER_AUTHORIZATION_FAILED:
        raise _refused(settings, "describe")
    if code != 0:
        raise BrokerError(f"cannot describe client quotas: {message or code}")
    found: dict[str, dict[str, float]] = {}
    for entry in answer.array(_described_entry):
        user, values = cast(tuple[str | None, dict[str, float]], entry)
        if user is not None:
            found[user] = values
    return found


def _alter_entry(reader: Reader) -> tuple[int, str | None, str | None]:
    code, message = reader.int16(), reader.string()
    return code, message, _user_of(reader)


def _described_entry(reader: Reader) -> tuple[str | None, dict[str, float]]:
    user = _user_of(reader)
    values = reader.array(lambda r: (r.string(), r.float64()))
    return user, dict(cast(list[tuple[str, float]], values))


def _user_of(reader: Reader) -> str | None:
    parts = cast(list[tuple[str, str | None]], reader.array(lambda r: (r.string(), r.string())))
    return dict(parts).get(_USER)


def _refused(settings: Settings, verb: str) -> NotAuthorisedError:
    operation = "ALTER_CONFIGS" if verb == "alter" else "DESCRIBE_CONFIGS"
    role = who(settings)
    return NotAuthorisedError(
        f"not authorised: {role} lacks {operation} on CLUSTER (to {verb} client quotas)",
        role=role,
        acl=operation,
        resource="CLUSTER",
    )

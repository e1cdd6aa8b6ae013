"""A fleet's client quotas, as data: the rates the broker holds each of its principals to.

Kafka enforces a user's quota on every client that logs in as that user, together, on each
broker (``quota.window.num`` windows of ``quota.window.size.seconds``): all agents of fleet
``a`` share ``User:a.agent`` and so share one produce rate per broker.  A client over its rate
is not refused; the broker delays its answers (throttling) and the client waits, so a fleet
that floods slows only itself.  Pure: :mod:`stepledger.kafka.quotas` sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

from stepledger.fleets.permissions import ROLES, principal

QuotaKey = Literal["producer_byte_rate", "consumer_byte_rate", "request_percentage"]
"""Kafka's names of the user quotas a fleet sets."""

#: Defaults of ``fleet create``: generous for one fleet's agents and daemons on a small
#: cluster, low enough that one runaway fleet leaves the brokers' network to the others.
DEFAULT_PRODUCE_BYTES_PER_S = 10 * 1024 * 1024
DEFAULT_FETCH_BYTES_PER_S = 50 * 1024 * 1024


@dataclass(frozen=True)
class Quota:
    """The rates each principal of a fleet is held to, per broker; None: no limit."""

    producer_byte_rate: float | None = DEFAULT_PRODUCE_BYTES_PER_S
    """Bytes a second the principal's producers may write to one broker."""
    consumer_byte_rate: float | None = DEFAULT_FETCH_BYTES_PER_S
    """Bytes a second the principal's consumers may fetch from one broker."""
    request_percentage: float | None = None
    """Share of one broker's request-handler and network threads (100: one thread's time)."""

    def __post_init__(self) -> None:
        for key, value in self.items(with_none=True):
            if value is not None and value <= 0:
                raise ValueError(f"{key} must be above 0 (or none: no limit), got {value}")

    @classmethod
    def held(cls, rates: Mapping[str, float]) -> Quota:
        """The quota of a user whose rates the broker holds as ``rates`` (absent: no limit)."""
        return cls(*(rates.get(f.name) for f in fields(cls)))

    def changed(self, rates: Mapping[str, float | None]) -> Quota:
        """This quota with the rates ``rates`` names replaced (None: no limit)."""
        return Quota(*(rates.get(f.name, getattr(self, f.name)) for f in fields(self)))

    def items(self, *, with_none: bool = False) -> list[tuple[QuotaKey, float | None]]:
        """Each quota key and its rate (the unset ones only when ``with_none``)."""
        found = [(f.name, getattr(self, f.name)) for f in fields(self)]
        return [(k, v) for k, v in found if with_none or v is not None]  # type: ignore[misc]

    def describe(self) -> str:
        """One line: ``producer_byte_rate=10485760, consumer_byte_rate=...`` or ``no limit``."""
        shown = [f"{k}={_number(v)}" for k, v in self.items() if v is not None]
        return ", ".join(shown) or "no limit"


def fleet_users(fleet: str) -> list[str]:
    """The SCRAM users of ``fleet``'s roles, each held to the fleet's quota."""
    return [principal(fleet, role) for role in ROLES]


def kafka_configs_commands(fleet: str, quota: Quota, bootstrap: str = "$BOOTSTRAP") -> list[str]:
    """The ``kafka-configs`` command lines that set ``quota`` on each of ``fleet``'s users
    (a rate without limit is left out: nothing to set)."""
    rates = ",".join(f"{k}={_number(v)}" for k, v in quota.items())
    if not rates:
        return []
    return [
        f"kafka-configs --bootstrap-server {bootstrap} --command-config admin.properties "
        f"--alter --entity-type users --entity-name {user} --add-config '{rates}'"
        for user in fleet_users(fleet)
    ]


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and value == int(value) else str(value)

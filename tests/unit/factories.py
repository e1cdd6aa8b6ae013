"""Event builders for unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Found, NotFound, Tool

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    """A manual clock for deterministic events."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now


def factory() -> EventFactory:
    return EventFactory("fleet", "producer", Clock())


def pay_tool(**kw: Any) -> Tool:
    def query(key: str, args: dict[str, Any]) -> Found | NotFound:
        return NotFound()

    return Tool(name="pay", effect="idempotent", keyed=True, policy="query", query=query, **kw)

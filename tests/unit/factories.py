"""Event builders for unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.domain import ids
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.kafka.gaps import LogStart

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
    def query(args: dict[str, Any], key: str) -> Found | NotFound:
        return NotFound()

    return Tool(name="pay", effect="idempotent", keyed=True, policy="query", query=query, **kw)


def comp_key(workflow_id: str, step_id: str, tool: Tool, attempt: int = 1) -> str:
    """The compensation key of a step's attempt, as the SDK and recovery derive it."""
    return ids.compensation_key(ids.idempotency_key(workflow_id, step_id, tool.name, attempt))


class LogStartAtZero(LogStart):
    """A log start that is 0 everywhere, asked of no broker (unit tests of the daemons)."""

    def of(self, topic: str, partition: int) -> int:
        """Nothing was ever deleted."""
        return 0

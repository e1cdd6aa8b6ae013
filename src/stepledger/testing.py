"""What you need to unit-test an agent without a broker: the log, reader and clock in memory.

::

    import stepledger as sl
    from stepledger.testing import Crash, InMemoryEventLog, ManualClock, ledger_over

    log, clock = InMemoryEventLog(), ManualClock()
    first = ledger_over(log, clock=clock)            # a "process"
    ...                                              # let a tool raise Crash: a SIGKILL mid-call
    clock.advance(60)                                # past the intent's deadline
    second = ledger_over(log, clock=clock)           # the next "process" resumes the same log

These are the implementations stepledger's own tests use: each new ledger over the same
log is a new process, a tool raising :class:`Crash` (a ``BaseException``, so no outcome is
recorded) stands for a crash inside the call, and a :class:`ManualClock` moves time past
intents' deadlines so resumes resolve what is in doubt.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.tools import Tool
from stepledger.history.legacy import InMemoryWorkflowReader
from stepledger.history.memory import InMemoryHistory
from stepledger.log import InMemoryEventLog
from stepledger.producer.ledger import Ledger
from stepledger.producer.session import ResumeOptions
from stepledger.resolution.registry import ToolRegistry

__all__ = [
    "Crash",
    "InMemoryEventLog",
    "InMemoryHistory",
    "InMemoryWorkflowReader",
    "ManualClock",
    "MemoryEventLetters",
    "ledger_over",
]


class Crash(BaseException):
    """Raise it inside a tool to stand for a SIGKILL mid-call: no outcome is recorded."""


class ManualClock:
    """A clock that ticks a millisecond per reading and jumps when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (past an intent's deadline, say)."""
        self.now += timedelta(seconds=seconds)


def ledger_over(
    log: InMemoryEventLog,
    *,
    tools: ToolRegistry | Iterable[Tool] | None = None,
    clock: ManualClock | None = None,
    options: ResumeOptions | None = None,
    **settings: Any,
) -> Ledger:
    """A ledger (one "process") over an in-memory log; resolves in-doubt steps at once."""
    return Ledger(
        Settings(**{"fleet_id": "test", "producer_id": "test", **settings}),
        log=log,
        tools=tools,
        clock=clock or ManualClock(),
        options=options or ResumeOptions(grace_s=0.0, resolve_timeout_s=5.0),
    )

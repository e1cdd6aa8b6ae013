"""The history contract (tests/history_contract.py) on the in-memory history, and on a reader
of the older surface seen as a history."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepledger.domain.events import Event
from stepledger.history.adapt import ReaderHistory, as_history
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import Until, WorkflowHistory
from stepledger.kafka import Position
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over
from tests.history_contract import CONTRACT, PAY


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_the_in_memory_history_keeps_the_contract(
    check: Callable[..., None],
) -> None:
    log = InMemoryEventLog()
    with ledger_over(log, tools=[PAY]) as ledger:
        history = InMemoryHistory(log)
        assert isinstance(ledger.history, InMemoryHistory)
        check(ledger, history)


class _OldReader:
    """A reader of the older surface, as a user may have written one."""

    def __init__(self, log: InMemoryEventLog) -> None:
        self.memory = InMemoryHistory(log)

    def read(self, workflow_id: str) -> list[Event]:
        return self.memory.read(workflow_id).events

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        return self.memory.follow(workflow_id, after, until, timeout_s)

    def close(self) -> None:
        pass


def test_a_reader_of_the_older_surface_is_read_first_never_whole() -> None:
    log = InMemoryEventLog()
    with ledger_over(log, tools=[PAY]) as ledger:
        ledger.start("w").finish()
        history: WorkflowHistory = as_history(_OldReader(log))
        assert isinstance(history, ReaderHistory)
        found = history.read("w")
        assert [e.type for e in found.events] == ["workflow_started", "workflow_finished"]
        assert not found.whole and history.known("w") is None

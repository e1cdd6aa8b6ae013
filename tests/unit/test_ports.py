"""The SDK asks its ports for what it needs through their methods, never by probing."""

from __future__ import annotations

from stepledger.deadletters.events import MemoryEventLetters
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over


class _Connecting(InMemoryEventLog):
    """An in-memory log that counts the connections asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.connects = 0

    def connect(self) -> None:
        self.connects += 1


class _Closing(MemoryEventLetters):
    """Dead letters that note being closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


def test_an_open_asks_the_log_to_connect_while_it_reads() -> None:
    log = _Connecting()
    ledger = ledger_over(log)
    ledger.start("wf", name="trip")
    assert log.connects == 0  # a start reads nothing: the append connects
    ledger.workflow("wf")
    assert log.connects == 1
    ledger.close()


def test_closing_the_ledger_closes_its_dead_letter_sink() -> None:
    letters = _Closing()
    ledger = ledger_over(InMemoryEventLog())
    ledger._dead_letters = letters
    ledger.close()
    assert letters.closed

"""The SDK asks its ports for what it needs through their methods, never by probing."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.errors import BrokerError
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over

# The module, not the function the projector package exports under the same name.
rebuild_module = importlib.import_module("stepledger.projector.rebuild")


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


class _ClosingRecords(MemoryRecordLetters):
    """Record dead letters that count being closed."""

    closed = 0

    def close(self) -> None:
        _ClosingRecords.closed += 1


def test_a_rebuild_that_fails_closes_its_dead_letter_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: Any, **__: Any) -> None:
        raise BrokerError("the broker went away")

    monkeypatch.setattr(rebuild_module, "KafkaRecordLetters", lambda settings: _ClosingRecords())
    monkeypatch.setattr(rebuild_module, "_read_all", fail)
    _ClosingRecords.closed = 0
    with pytest.raises(BrokerError, match="went away"):
        rebuild_module.rebuild(Settings(), tmp_path / "p.duckdb", republish_dead_letters=True)
    assert _ClosingRecords.closed == 1  # its producer was left open before

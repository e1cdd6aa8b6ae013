"""The history contract (tests/history_contract.py) on the Kafka history, on the broker under
test: a ledger writes, a history made for the same step log reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepledger.config import Settings
from stepledger.history.kafka import KafkaHistory
from stepledger.producer import Ledger
from tests.history_contract import CONTRACT, PAY


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_the_kafka_history_keeps_the_contract(
    check: Callable[..., None], settings: Settings
) -> None:
    with Ledger(settings, tools=[PAY]) as ledger:
        assert isinstance(ledger.history, KafkaHistory)
        history = KafkaHistory(settings)
        try:
            check(ledger, history)
        finally:
            history.close()

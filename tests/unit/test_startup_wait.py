"""A daemon started while its broker comes up waits for it (bounded); a missing topic fails."""

from __future__ import annotations

import time

import pytest

from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka import broker as kafka


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int, error: BrokerError) -> list[float]:
    calls: list[float] = []

    def topic_partitions(settings: Settings, topic: str, timeout: float = 5.0) -> list[int]:
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise error
        return [0, 1]

    monkeypatch.setattr(kafka, "topic_partitions", topic_partitions)
    return calls


def test_an_unreachable_broker_is_waited_for_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _flaky(monkeypatch, 2, BrokerError("cannot reach Kafka at 127.0.0.1:1"))
    assert kafka.reachable_partitions(Settings(startup_wait_s=10), "t") == [0, 1]
    assert len(calls) == 3


def test_without_a_wait_it_fails_at_once_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 5, BrokerError("cannot reach Kafka at 127.0.0.1:1"))
    with pytest.raises(BrokerError, match="cannot reach Kafka"):
        kafka.reachable_partitions(Settings(), "t")
    assert len(calls) == 1


def test_a_missing_topic_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 5, BrokerError("topic 't' does not exist", retryable=False))
    with pytest.raises(BrokerError, match="does not exist"):
        kafka.reachable_partitions(Settings(startup_wait_s=10), "t")
    assert len(calls) == 1


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 10_000, BrokerError("cannot reach Kafka at 127.0.0.1:1"))
    began = time.monotonic()
    with pytest.raises(BrokerError):
        kafka.reachable_partitions(Settings(startup_wait_s=0.3), "t")
    assert time.monotonic() - began < 2.0 and len(calls) >= 2

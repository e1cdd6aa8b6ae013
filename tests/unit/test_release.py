"""A librdkafka client whose destroy never returns does not hold its caller.

librdkafka's destroy can wait forever on a broker thread after a broker restart
(confluentinc/librdkafka#4674); a resumed agent's ``Ledger.close`` waited in it until the
chaos run killed the agent.  The hang itself is librdkafka's and is not reproducible on
demand, so these fakes block in ``close`` and in the destructor as it did.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from stepledger.config import Settings
from stepledger.kafka import DurableProducer, release
from tests.unit.test_producer_fatal import FakeProducer

LIMIT_S = 0.3


class Stuck:
    """A client whose close blocks until ``let_go`` is set, noting the thread it ran on."""

    def __init__(self) -> None:
        self.let_go = threading.Event()
        self.closed_on: list[str] = []

    def close(self) -> None:
        self.closed_on.append(threading.current_thread().name)
        self.let_go.wait(10)


def test_a_close_that_never_returns_holds_its_caller_for_the_limit_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stuck = Stuck()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=release.__name__):
        assert not release.close_within(stuck.close, "consumer", LIMIT_S)
    assert LIMIT_S <= time.monotonic() - started < LIMIT_S + 1.0
    assert stuck.closed_on == ["stepledger-close"]
    assert "did not close within" in caplog.text and "librdkafka#4674" in caplog.text
    stuck.let_go.set()


def test_a_close_that_returns_is_waited_for_and_its_errors_are_quiet() -> None:
    closed: list[bool] = []

    def close() -> None:
        closed.append(True)
        raise RuntimeError("Consumer closed")

    assert release.close_within(close, "consumer", LIMIT_S)
    assert closed == [True]


#: Where the producers below are destroyed (a class-level holder: the instance is gone).
DESTROY = Stuck()


class StuckProducer(FakeProducer):
    """Its destruction blocks, as ``rd_kafka_destroy`` in the producer's deallocation did."""

    def __del__(self) -> None:
        DESTROY.close()


def test_a_producer_whose_destroy_never_returns_does_not_hold_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(release, "CLOSE_LIMIT_S", LIMIT_S)
    # Made here, not through made_clients: its list would keep the client alive.
    monkeypatch.setattr(
        "stepledger.kafka.producer._new_producer", lambda conf: StuckProducer(conf, dead=False)
    )
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    try:
        assert producer.append("t", b"k", b"v").offset == 7
        started = time.monotonic()
        producer.close()
        assert time.monotonic() - started < LIMIT_S + 1.0
        assert DESTROY.closed_on == ["stepledger-close"]  # not the caller's thread
    finally:
        DESTROY.let_go.set()

"""A producer used from one event loop after another keeps none of them alive."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.kafka import DurableProducer
from tests.unit.test_producer_fatal import FakeProducer, made_clients


def test_an_event_loop_that_ended_is_not_kept_by_the_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``asyncio.run`` per request (a sync server calling async agents) through one ledger:
    each loop's hand-off held the loop strongly as the value of a weak map keyed by that
    loop, so no loop was ever freed (measured: 50 runs, 50 loops alive)."""
    monkeypatch.setattr(
        "stepledger.kafka.producer._new_producer",
        lambda conf: FakeProducer(conf, dead=False),
    )
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one() -> Any:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return await producer.send_async("t", b"k", b"v")

    try:
        for _ in range(5):
            assert asyncio.run(one()).offset == 7
        gc.collect()
        assert [ref for ref in loops if ref() is not None] == []
        assert len(producer._handoffs) == 0
    finally:
        producer.close()


class HeldProducer(FakeProducer):
    """Serves no report until ``held`` is cleared."""

    held = True

    def poll(self, timeout: float = 0) -> int:
        if self.held:
            time.sleep(min(timeout, 0.01))
            return 0
        return super().poll(timeout)


def test_a_loop_that_ended_with_a_record_in_flight_is_freed_once_it_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = made_clients(monkeypatch, lambda conf, made: HeldProducer(conf, dead=False))
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def gone_before_its_report() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        producer.send_async("t", b"k", b"v")  # never awaited: the caller gave up

    try:
        asyncio.run(gone_before_its_report())
        made[0].held = False
        deadline = time.monotonic() + 2.0
        while made[0].pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not made[0].pending
        gc.collect()
        assert loops[0]() is None
    finally:
        producer.close()

"""Records produced under load linger in a second client; each key keeps its order.

With ``linger.ms=0`` a record produced while others are in flight is a produce request of
its own; under load the step log's producer sends such records through a client that
lingers for company (:mod:`stepledger.kafka.lanes`).  Nothing orders records across two
clients, so a key stays on one client while any of its records is in flight: without that,
a key's second record, sent once the load had gone, would leave at once and land before
its first, still lingering.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

import stepledger as sl
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.errors import DurabilityError
from stepledger.kafka import Batching, DurableProducer, Position
from stepledger.kafka.reader import read_topic
from tests.conftest import Factory

#: Long enough that a record sent after a lingering one would overtake it if it could.
LINGER_MS = 300


def _lingered(ledger: sl.Ledger) -> list[bytes | None]:
    """The values the ledger's producer sends through its lingering client from now on."""
    lingering = ledger.log._producer._lingering  # type: ignore[attr-defined]
    produce_now, lingered = lingering._produce_now, []

    def counted(*args: Any) -> None:
        lingered.append(args[2])
        produce_now(*args)

    lingering._produce_now = counted
    return lingered


def _values_by_key(settings: Settings) -> dict[bytes, list[bytes]]:
    seen: dict[bytes, list[bytes]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3, max_time=30):
        assert record.key is not None and record.value is not None
        seen.setdefault(record.key, []).append(record.value)
    return seen


def test_a_key_sent_again_after_the_load_went_lands_after_its_lingering_record(
    settings: Settings,
) -> None:
    producer = DurableProducer(settings, batching=Batching(LINGER_MS, from_in_flight=2))
    topic = settings.topic
    try:
        producer.append(topic, b"warm-up", b"0")  # the producer id, the connection
        load = [producer.queue(topic, key, b"1", may_linger=True) for key in (b"a", b"b")]
        first = producer.queue(topic, b"k", b"k1", may_linger=True)  # 2 in flight: this one lingers
        positions = [wait() for wait in load]  # the load is gone; k1 still lingers
        assert producer._lanes is not None and producer._lanes.in_flight == 1
        second = producer.queue(topic, b"k", b"k2", may_linger=True)
        landed: list[Position] = [second(), first()]
        assert landed[0].offset > landed[1].offset, (landed, positions)
        assert producer._lanes.in_flight == 0
        assert producer._lingering is not None and producer._lingering._producer is not None
    finally:
        producer.close()
    assert _values_by_key(settings)[b"k"] == [b"k1", b"k2"]


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_agents_under_load_write_each_workflow_in_order_through_both_clients(
    make_settings: Factory, pipelined: bool
) -> None:
    """Every record produced while another is in flight lingers: both clients carry steps."""
    settings = make_settings(batch_from_in_flight=1, batch_linger_ms=5.0)
    options = sl.ResumeOptions(pipeline_outcomes=pipelined)

    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
        return i

    async def agents(ledger: sl.Ledger) -> None:
        async def one(n: int) -> None:
            wf = await ledger.astart(f"agent-{n}")
            for i in range(5):
                assert await wf.astep(f"s{i}", act, i=i) == i
            await wf.afinish()

        await asyncio.gather(*(one(n) for n in range(12)))

    with sl.Ledger(settings, tools=[act], options=options) as ledger:
        lingered = _lingered(ledger)
        asyncio.run(agents(ledger))
        codec = Codec()
        kinds_lingered = {f"{codec.decode(value).type}" for value in lingered if value}
        # Intents and outcomes (pipelined ones included, sent by a coroutine) linger.
        assert {"step_intended", "step_outcome"} <= kinds_lingered, kinds_lingered
    kinds: dict[str, list[str]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3, max_time=30):
        event = record.event
        assert event is not None
        kinds.setdefault(event.workflow_id, []).append(f"{event.type} {event.step_id}")
    steps = [f"step_{k} s{i}" for i in range(5) for k in ("intended", "outcome")]
    expected = ["workflow_started None", *steps, "workflow_finished None"]
    assert len(kinds) == 12
    for workflow, seen in kinds.items():
        assert seen == expected, workflow


def test_records_a_replaced_lingering_client_held_are_reported_and_counted(
    make_settings: Factory,
) -> None:
    """A lingering client declared dead (fatal, or stuck) is replaced by the next record.

    librdkafka's purge reports the records the old client held only after it returns
    (measured: often none by the poll that follows it), so the old client must still be
    served until it holds nothing: dropped at once, its records were never reported, their
    waits ran to the time limit and each stayed counted in flight for good (enough of them
    and every later record lingered).
    """
    settings = make_settings(durable_timeout_s=2.0)
    producer = DurableProducer(settings, batching=Batching(50.0, from_in_flight=1))
    topic, lanes = settings.topic, producer._lanes
    assert lanes is not None and producer._lingering is not None
    try:
        producer.append(topic, b"warm-up", b"0")
        for round_ in range(5):  # the purge's reports come late in most rounds, not all
            held = [producer.queue(topic, b"k%d" % n, b"v", may_linger=True) for n in range(100)]
            producer._lingering._note(KafkaError(KafkaError._FATAL, "test", fatal=True))
            producer.queue(topic, b"trigger", b"t", may_linger=True)()  # the new lingering client
            deadline = time.monotonic() + 3.0  # still before any wait's own limit (4 s)
            while lanes.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            assert lanes.in_flight == 0, f"round {round_}: {lanes.in_flight} never reported"
            assert not lanes._held
            for wait in held:
                with contextlib.suppress(DurabilityError):
                    wait()
    finally:
        producer.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_threads_under_load_never_linger(make_settings: Factory, pipelined: bool) -> None:
    """A thread waits for its own record right away: lingering cost threads half their
    steps/s (32 threads on Apache Kafka: 1,971 against 3,207 steps/s, pipelined 2,092
    against 4,069), so only asyncio records take the lingering client."""
    settings = make_settings(batch_from_in_flight=1, batch_linger_ms=5.0)
    options = sl.ResumeOptions(pipeline_outcomes=pipelined)

    @sl.tool(keyed=True, name="act")
    def act(i: int, *, idempotency_key: str) -> int:
        return i

    with sl.Ledger(settings, tools=[act], options=options) as ledger:
        producer = ledger.log._producer  # type: ignore[attr-defined]
        lingered = _lingered(ledger)

        def one(n: int) -> None:
            wf = ledger.start(f"agent-{n}")
            for i in range(5):
                assert wf.step(f"s{i}", act, i=i) == i
            wf.finish()

        threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        assert producer._lanes.in_flight == 0
        assert lingered == [], "a thread's record lingered"
    seen = {
        record.event.workflow_id
        for record in read_topic(settings, Codec(), idle_timeout=0.3, max_time=30)
        if record.event is not None
    }
    assert seen == {f"agent-{n}" for n in range(8)}

"""Where a step's time goes that no broker setting changes: the SDK's own CPU, and a pair.

- **The SDK alone**: 10-step workflows through one ``Ledger`` over an in-memory log that
  still Avro-encodes every event and builds its headers (what the Kafka log does before it
  hands a record to librdkafka), sync ``step`` and asyncio ``astep``: process CPU per step
  (``time.process_time``), median of three.  This is the floor of the SDK's CPU per step
  with any broker; the raw client's whole step is compared with it in docs/benchmarks.md.
- **Two records on one connection**: raw confluent-kafka with the SDK's producer settings,
  one partition, two records per iteration: sent one after the other (each awaited), and
  sent back to back then both awaited (what pipelined outcomes do).  p50 of each; the ratio
  says how much of a round trip the second record costs when it does not wait.

``python -m bench.sdk_cpu [--quick] [--engine kafka]``
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

import stepledger as sl
from bench.common import Row, broker, cli, fresh_settings
from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.kafka import DURABLE_PRODUCER, Position
from stepledger.log import InMemoryEventLog, event_headers

STEPS = 10


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """The bench's tool: the work measured is the ledger's own."""
    return i


@sl.tool(keyed=True, name="act")
async def aact(i: int, *, idempotency_key: str) -> int:
    """The same tool for asyncio steps."""
    return i


class EncodingLog(InMemoryEventLog):
    """An in-memory log that encodes each event and builds its headers, as Kafka's does."""

    codec = Codec()

    def append(self, event: Event) -> Position:
        self.codec.encode(event)
        event_headers(event)
        return super().append(event)


def sdk_us(workflows: int) -> float:
    """Process CPU per sync step over the encoding log."""
    ledger = sl.Ledger(log=EncodingLog(), tools=[act])
    began = time.process_time()
    for w in range(workflows):
        wf = ledger.start(f"w{w}")
        for i in range(STEPS):
            wf.step(f"s{i}", act, i=i)
        wf.finish()
    return (time.process_time() - began) / (workflows * STEPS) * 1e6


def sdk_async_us(workflows: int) -> float:
    """Process CPU per asyncio step over the encoding log."""

    async def run() -> float:
        ledger = sl.Ledger(log=EncodingLog(), tools=[aact])
        began = time.process_time()
        for w in range(workflows):
            wf = await ledger.astart(f"w{w}")
            for i in range(STEPS):
                await wf.astep(f"s{i}", aact, i=i)
            await wf.afinish()
        return (time.process_time() - began) / (workflows * STEPS) * 1e6

    return asyncio.run(run())


def pair_ms(servers: str, iterations: int) -> tuple[float, float]:
    """p50 ms of two records awaited one after the other, and of two sent back to back."""
    settings = fresh_settings(servers, partitions=1)
    producer = Producer(settings.client_config(**DURABLE_PRODUCER))
    done: list[Any] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        done.append(err)

    def wait(count: int) -> None:
        while len(done) < count:
            producer.poll(0.01)

    value = b"x" * 200
    timings: dict[str, list[float]] = {"serial": [], "pair": []}
    try:
        for _ in range(2):  # the first round warms the connection up; the second counts
            timings = {"serial": [], "pair": []}
            for mode in timings:
                for _ in range(iterations):
                    done.clear()
                    began = time.perf_counter()
                    producer.produce(settings.topic, value, b"k", on_delivery=delivered)
                    if mode == "serial":
                        wait(1)
                    producer.produce(settings.topic, value, b"k", on_delivery=delivered)
                    wait(2)
                    assert done == [None, None], done
                    timings[mode].append(time.perf_counter() - began)
    finally:
        producer.flush(10)
    return (
        statistics.median(timings["serial"]) * 1e3,
        statistics.median(timings["pair"]) * 1e3,
    )


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """The SDK's CPU per step (no broker), then the pair on the broker."""
    workflows, repeats, iterations = (20, 1, 30) if quick else (300, 3, 400)
    sdk_us(5)  # imports, caches
    sync = statistics.median(sdk_us(workflows) for _ in range(repeats))
    asynchronous = statistics.median(sdk_async_us(workflows) for _ in range(repeats))
    print(f"[sdk_cpu] SDK alone: {sync:.0f} us/step sync, {asynchronous:.0f} asyncio", flush=True)
    with broker(bootstrap) as servers:
        serial, pair = pair_ms(servers, iterations)
    print(f"[sdk_cpu] two records: {serial:.3f} ms one after the other, {pair:.3f} ms together")
    return [
        Row("sdk_cpu", "SDK alone, no broker: CPU per sync step", sync, None, "us", "", False),
        Row("sdk_cpu", "SDK alone, no broker: CPU per asyncio step", asynchronous, None, "us"),
        Row(
            "sdk_cpu",
            "two records sent together, p50 (vs one after the other)",
            pair,
            serial,
            "ms",
            higher_is_better=False,
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

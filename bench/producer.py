"""Producer SDK vs raw confluent-kafka, same settings, same payload bytes, same run.

- Throughput: 8 concurrent agents, each recording steps (intent + outcome, each awaited)
  through the SDK, vs 8 threads producing the same pre-encoded bytes raw and each waiting
  for its own delivery report (the same durability contract). Target >= 0.5.
- Latency: one durable intent through the SDK vs one raw produce-and-wait. Target <= 1.3x p50.
- SDK CPU per step: the thread CPU time (``time.thread_time``) of one step (intent + call +
  outcome) through a Ledger whose producer acknowledges at once (no broker, no client, no
  wait), 20 steps per workflow: what the SDK's own Python costs per step.  Target: at most
  half of the ~400 us measured for issue 14 (the baseline column).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Producer

from bench.common import Row, broker, cli, fresh_settings, percentile
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.kafka import DURABLE_PRODUCER, Position
from stepledger.log import KafkaEventLog, event_headers
from stepledger.producer import Ledger

AGENTS = 8
#: SDK CPU per step measured for issue 14 before the fast path (its profile of one step).
CPU_BEFORE_US = 400.0
TOOL = Tool(name="charge", effect="idempotent", keyed=True)
ARGS = {"amount": 1250, "currency": "EUR", "customer": "cus_0001", "memo": "x" * 120}


def _raw_producer(settings: Settings) -> Producer:
    """A raw producer with the SDK's durability settings, connected and warmed up."""
    producer = Producer(settings.client_config(**DURABLE_PRODUCER))
    producer.produce(settings.topic, b"warm-up", b"warm-up")
    producer.flush(10)
    return producer


# confluent-kafka's produce() takes headers whose values may also be str.
Payload = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]


def _payloads(n: int) -> list[Payload]:
    """Pre-encoded intent records: exactly the bytes the SDK produces."""
    codec, factory = Codec(), EventFactory("bench", "bench")
    out: list[Payload] = []
    for i in range(n):
        event = factory.intent(f"wf-{i}", "s", TOOL, ARGS, sequence=0)
        out.append((event.workflow_id.encode(), codec.encode(event), list(event_headers(event))))
    return out


def _poller(producer: Producer, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=lambda: [producer.poll(0.05) for _ in iter(stop.is_set, True)])
    thread.daemon = True
    thread.start()
    return thread


def raw_concurrent(settings: Settings, per_agent: int) -> float:
    """Events/s: 8 threads, each producing a pre-encoded record and waiting for its report."""
    producer, stop = _raw_producer(settings), threading.Event()
    _poller(producer, stop)
    payloads = _payloads(AGENTS * per_agent)

    def agent(a: int) -> None:
        for key, value, headers in payloads[a * per_agent : (a + 1) * per_agent]:
            done = threading.Event()
            producer.produce(settings.topic, value, key, headers=headers, on_delivery=_setter(done))
            done.wait(10)

    elapsed = _run_agents(agent)
    stop.set()
    producer.flush(10)
    return AGENTS * per_agent / elapsed


def _setter(done: threading.Event) -> Any:
    return lambda err, msg: done.set()


def sdk_concurrent(settings: Settings, steps_per_agent: int) -> float:
    """Events/s: 8 agents recording steps (2 durable events each) through one Ledger."""
    ledger = Ledger(settings)
    workflows = [ledger.start(f"wf-{a}") for a in range(AGENTS)]  # also warms the producer

    def agent(a: int) -> None:
        for i in range(steps_per_agent):
            workflows[a].step(f"s{i}", TOOL, ARGS, fn=lambda args, key: {"ok": True})

    elapsed = _run_agents(agent)
    ledger.close()
    return AGENTS * 2 * steps_per_agent / elapsed


def raw_pipelined(settings: Settings, n: int) -> float:
    """Events/s: raw produce of pre-encoded bytes without waiting per record (context only)."""
    producer, payloads = _raw_producer(settings), _payloads(n)
    start = time.perf_counter()
    for key, value, headers in payloads:
        while True:
            try:
                producer.produce(settings.topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(30)
    return n / (time.perf_counter() - start)


def _run_agents(agent: Any) -> float:
    threads = [threading.Thread(target=agent, args=(a,)) for a in range(AGENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return time.perf_counter() - start


def latencies(
    raw_settings: Settings, sdk_settings: Settings, n: int
) -> tuple[list[float], list[float]]:
    """Seconds per durable write, raw produce-one-and-wait vs an SDK intent, interleaved.

    Interleaving puts both in the same moments of machine load, so the ratio is fair.
    """
    producer, payloads = _raw_producer(raw_settings), _payloads(n)
    ledger = Ledger(sdk_settings)
    ledger.start("warm-up")
    raw: list[float] = []
    sdk: list[float] = []
    for i, (key, value, headers) in enumerate(payloads):
        start = time.perf_counter()
        producer.produce(raw_settings.topic, value, key, headers=headers)
        producer.flush(10)
        raw.append(time.perf_counter() - start)
        start = time.perf_counter()
        ledger.log.append(ledger.events.intent(f"wf-{i}", "s", TOOL, ARGS, sequence=0))
        sdk.append(time.perf_counter() - start)
    ledger.close()
    return raw, sdk


class _AcksAtOnce:
    """A producer that acknowledges every record at once: the step's CPU without the wait.

    Records land one after another in one partition, as a lone runner's do on a quiet log,
    and stay here for :class:`_ReadsAcked`: a workflow's first intent is read back through
    its position (the fence), its next ones are proven by their offsets."""

    def __init__(self) -> None:
        self.values: dict[bytes, list[bytes]] = {}
        self._next = 0

    def append(self, topic: str, key: Any, value: Any, headers: Any = None) -> Position:
        self.values.setdefault(key, []).append(value)
        self._next += 1
        return Position(topic, 0, self._next - 1)

    def close(self) -> None:
        return None


class _ReadsAcked:
    """Reads a workflow back from what :class:`_AcksAtOnce` acknowledged (decoded, as a
    broker read's records are), so the read back's CPU counts and no broker is asked."""

    bounded_reads = False

    def __init__(self, acked: _AcksAtOnce) -> None:
        self._acked, self._codec = acked, Codec()

    def read(self, workflow_id: str) -> list[ev.Event]:
        values = self._acked.values.get(workflow_id.encode(), [])
        return [self._codec.decode(value) for value in values]

    def close(self) -> None:
        return None


def sdk_cpu_per_step(steps: int, per_workflow: int = 20) -> float:
    """Microseconds of thread CPU per step (best of 5 rounds), the broker wait excluded."""
    settings = Settings(bootstrap="127.0.0.1:9", topic="cpu", producer_id="bench")
    producer = _AcksAtOnce()
    log = KafkaEventLog(settings, producer=producer)  # type: ignore[arg-type]
    ledger = Ledger(settings, log=log, reader=_ReadsAcked(producer))  # type: ignore[arg-type]
    rounds = []
    for r in range(5):
        spent = 0.0
        for i in range(steps):
            if i % per_workflow == 0:
                workflow = ledger.start(f"wf-{r}-{i}")
            start = time.thread_time()
            workflow.step(f"s{i}", TOOL, ARGS, fn=lambda args, key: {"ok": True})
            spent += time.thread_time() - start
        rounds.append(spent / steps * 1e6)
    return min(rounds)


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Measure everything; quick mode (a smoke run) uses a few records."""
    per_agent, lat_n = (40, 100) if quick else (1500, 3000)
    cpu = sdk_cpu_per_step(100 if quick else 3000)
    with broker(bootstrap) as servers:
        warm_up = 50 if quick else 200
        latencies(fresh_settings(servers), fresh_settings(servers), warm_up)
        raw = raw_concurrent(fresh_settings(servers), 2 * per_agent)
        sdk = sdk_concurrent(fresh_settings(servers), per_agent)
        pipelined = raw_pipelined(fresh_settings(servers), 20 * per_agent * AGENTS // 8)
        raw_lat, sdk_lat = latencies(fresh_settings(servers), fresh_settings(servers), lat_n)
    ms = 1000.0
    return [
        Row(
            "producer",
            "8 agents, events/s (vs raw 8 threads waiting per record)",
            sdk,
            raw,
            "events/s",
            ">=0.5",
        ),
        Row(
            "producer",
            "8 agents, events/s (vs raw pipelined produce, context)",
            sdk,
            pipelined,
            "events/s",
        ),
        Row(
            "producer",
            "durable intent p50 (vs raw produce-and-wait p50)",
            percentile(sdk_lat, 50) * ms,
            percentile(raw_lat, 50) * ms,
            "ms",
            "<=1.3",
            False,
        ),
        Row(
            "producer",
            "durable intent p99 (vs raw produce-and-wait p99)",
            percentile(sdk_lat, 99) * ms,
            percentile(raw_lat, 99) * ms,
            "ms",
            "",
            False,
        ),
        Row(
            "producer",
            "SDK CPU per step, wait excluded (vs ~400 us before, issue 14)",
            cpu,
            CPU_BEFORE_US,
            "us",
            "<=0.5",
            False,
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

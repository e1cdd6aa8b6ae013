"""Shared bench helpers: a broker for the run, result rows, percentiles, the summary table."""

from __future__ import annotations

import asyncio
import contextlib
import platform
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Producer

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.factory import EventFactory
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import step_log_config
from stepledger.log import event_headers
from stepledger_dev.broker import LocalBroker

#: One finished workflow's events (a module-level function: worker processes import it).
WorkflowShape = Callable[[EventFactory, str], list[Any]]


@dataclass(frozen=True)
class Row:
    """One measured figure, its raw baseline from the same run, and the target ratio."""

    bench: str
    name: str
    value: float
    baseline: float | None
    unit: str
    target: str = ""
    higher_is_better: bool = True

    @property
    def ratio(self) -> float | None:
        """value / baseline (for latencies too: lower is better there)."""
        return None if not self.baseline else self.value / self.baseline

    @property
    def met(self) -> str:
        """'yes', 'no' or '' when the row has no target."""
        if not self.target or self.ratio is None:
            return ""
        op, limit = self.target[:2], float(self.target[2:])
        return "yes" if (self.ratio >= limit if op == ">=" else self.ratio <= limit) else "no"

    def as_dict(self) -> dict[str, Any]:
        """The row with its ratio, for JSON."""
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


ENGINES = ("tansu", "kafka")


@contextlib.contextmanager
def run_broker(engine: str, bootstrap: str | None) -> Iterator[str | None]:
    """The bootstrap every bench of the run gets.

    ``kafka``: one 1-node Apache Kafka (KRaft) for the whole run, so raw baselines and
    stepledger are measured on the same broker.  ``tansu``: the given bootstrap, or None
    (each bench starts its own Tansu).
    """
    if engine == "kafka":
        if bootstrap:
            raise SystemExit("--engine kafka starts its own broker: drop --bootstrap")
        from stepledger_dev.apache_kafka import KafkaBroker

        with KafkaBroker(nodes=1) as kafka:
            yield kafka.bootstrap
        return
    yield bootstrap


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """Use the given broker, or start a local one for the run."""
    if bootstrap:
        yield bootstrap
        return
    with LocalBroker() as local:
        yield local.bootstrap


def fresh_settings(bootstrap: str, partitions: int = 3, **overrides: Any) -> Settings:
    """Settings with a new topic for one measurement."""
    settings = Settings(
        bootstrap=bootstrap, topic=f"bench-{uuid.uuid4().hex[:8]}", producer_id="bench", **overrides
    )
    # As `stepledger init` makes it (kept forever, broker-stamped): a bench on the broker's
    # defaults would also print the SDK's retention warning for every Ledger.
    configs = {settings.topic: step_log_config()}
    ensure_topics(
        settings, [settings.topic, settings.dlq_topic], partitions=partitions, configs=configs
    )
    return settings


def produce_bulk(
    settings: Settings, records: list[tuple[bytes, bytes]], timeout: float = 120
) -> None:
    """Produce pre-encoded (key, value) records as fast as the broker takes them (setup only)."""
    from confluent_kafka import Producer

    producer = Producer(
        settings.client_config(**{"linger.ms": 20, "batch.size": 1_000_000, "acks": "all"})
    )
    for key, value in records:
        while True:
            try:
                producer.produce(settings.topic, value, key)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(timeout)


def cli(run: Callable[..., list[Row]], description: str | None) -> None:
    """The ``python -m bench.NAME`` entry point every bench shares."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--bootstrap", help="use this broker instead of a local one")
    parser.add_argument("--engine", choices=ENGINES, default="tansu", help="the local broker")
    args = parser.parse_args()
    with run_broker(args.engine, args.bootstrap) as bootstrap:
        print(table(run(quick=args.quick, bootstrap=bootstrap)))


def fixed_clock(at: datetime) -> Callable[[], datetime]:
    """A clock that always reads ``at``."""
    return lambda: at


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of the values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    """The median."""
    return statistics.median(values)


def machine() -> str:
    """A one-line description of this machine."""
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: list[Row]) -> str:
    """The summary table, as Markdown."""
    lines = [
        "| bench | measure | stepledger | raw baseline | unit | ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = "" if r.baseline is None else f"{r.baseline:,.2f}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"| {r.bench} | {r.name} | {r.value:,.2f} | {base} | {r.unit} | {ratio} "
            f"| {r.target} | {r.met} |"
        )
    return "\n".join(lines)


def produce_one(producer: Producer, topic: str, event: Any, codec: Codec) -> None:
    """Produce one event raw (no durability wait), waiting while the client's queue is full."""
    value, key = codec.encode(event), event.workflow_id.encode()
    while True:
        try:
            producer.produce(topic, value, key, headers=event_headers(event))  # type: ignore[arg-type]
            return
        except BufferError:
            producer.poll(0.01)


def _produce_range(
    bootstrap: str, topic: str, shape: WorkflowShape, prefix: str, start: int, stop: int
) -> int:
    """Produce workflows ``prefix-start`` .. ``prefix-(stop-1)`` (in a worker process)."""
    codec, factory = Codec(), EventFactory("bench", "bench")
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": "all"}
    )
    count = 0
    for i in range(start, stop):
        for event in shape(factory, f"{prefix}-{i}"):
            produce_one(producer, topic, event, codec)
            count += 1
    producer.flush(120)
    return count


def fill_log(
    settings: Settings,
    events: int,
    prefix: str,
    shape: WorkflowShape,
    per_workflow: int,
    workers: int = 2,
) -> int:
    """Write about ``events`` events of workflows of ``shape``, from worker processes."""
    workflows = max(1, events // per_workflow)
    workers = min(workers, workflows)
    bounds = [workflows * w // workers for w in range(workers + 1)]
    with ProcessPoolExecutor(workers) as pool:
        futures = [
            pool.submit(
                _produce_range,
                settings.bootstrap,
                settings.topic,
                shape,
                prefix,
                bounds[w],
                bounds[w + 1],
            )
            for w in range(workers)
        ]
        return sum(f.result() for f in futures)


def broker_pids(bootstrap: str) -> list[int]:
    """The local processes listening on the bootstrap's ports (empty when none is found here).

    Read from /proc (Linux): a listening socket's inode, then the process holding it.  Lets
    a bench charge the broker's CPU to a workload whichever engine started it.
    """
    import os
    from pathlib import Path

    ports = {int(server.rpartition(":")[2]) for server in bootstrap.split(",")}
    inodes: set[str] = set()
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table_path).read_text().splitlines()[1:]:
                fields = line.split()
                port = int(fields[1].rpartition(":")[2], 16)
                if fields[3] == "0A" and port in ports:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = Path(f"/proc/{pid}/fd")
            if any(os.readlink(fds / fd) in inodes for fd in os.listdir(fds)):
                pids.append(int(pid))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU the processes have used so far (0 for one that is gone)."""
    import os
    from pathlib import Path

    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def thread_ticks() -> dict[tuple[str, str], int]:
    """CPU clock ticks of each of this process's threads, by (tid, name), from /proc (Linux).

    librdkafka names its threads ``rdk:...``: the split shows the client's share of a
    process's CPU against the interpreter's.
    """
    import os
    from pathlib import Path

    ticks: dict[tuple[str, str], int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[(tid, name)] = int(fields[11]) + int(fields[12])
    return ticks


def agents_in_threads(agents: int, agent: Callable[[int], int]) -> float:
    """Steps per second of ``agents`` threads, each running ``agent(index)`` (its steps)."""
    counts = [0] * agents

    def body(index: int) -> None:
        counts[index] = agent(index)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(agents)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    elapsed = time.perf_counter() - began
    assert sum(counts) == agents * counts[0] > 0, counts
    return sum(counts) / elapsed


def agents_in_asyncio(agents: int, agent: Callable[[int], Any]) -> float:
    """Steps per second of ``agents`` coroutines on one event loop."""

    async def all_agents() -> float:
        began = time.perf_counter()
        counts = await asyncio.gather(*(agent(n) for n in range(agents)))
        elapsed = time.perf_counter() - began
        assert sum(counts) == agents * counts[0] > 0, counts
        return float(sum(counts) / elapsed)

    return asyncio.run(all_agents())

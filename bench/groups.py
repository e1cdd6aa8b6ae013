"""Consumer-group join and rebalance times on Tansu and Apache Kafka, classic and KIP-848.

``python -m bench.groups [--engines tansu,kafka] [--repeat 5]`` starts each broker itself
(Apache Kafka through ``stepledger_dev.apache_kafka.KafkaBroker``) and, for each protocol the
engine speaks, times on a 6-partition topic:

- join: one consumer subscribes; until its first non-empty assignment;
- second join: another member subscribes while the first polls; until both own partitions;
- leave: the second member closes; until the first owns all six partitions again.

Classic runs use the daemons' settings (cooperative-sticky, session 6 s, heartbeat 0.5 s);
KIP-848 runs (``group.protocol=consumer``) take the broker's group settings, Kafka's
defaults (heartbeat 5 s).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from stepledger.config import Settings
from stepledger.kafka import ensure_topics
from stepledger_dev.apache_kafka import KAFKA_VERSION, KafkaBroker
from stepledger_dev.broker import LocalBroker

PARTITIONS = 6
LIMIT_S = 90.0
CLASSIC = {
    "group.protocol": "classic",
    "partition.assignment.strategy": "cooperative-sticky",
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
}
KIP848 = {"group.protocol": "consumer"}


@dataclass
class Member:
    """One group member polled by its own thread; tracks what it owns."""

    bootstrap: str
    group: str
    topic: str
    protocol: dict[str, Any]
    owned: set[int] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Member:
        """Subscribe and poll in a thread until ``close``."""
        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            **self.protocol,
        }
        consumer = Consumer(conf)
        consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked)
        self.thread = threading.Thread(target=self._loop, args=(consumer,), daemon=True)
        self.thread.start()
        return self

    # Both protocols measured here are incremental (cooperative-sticky, KIP-848).
    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        consumer.incremental_assign(parts)
        self.owned = self.owned | {p.partition for p in parts}

    def _revoked(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        consumer.incremental_unassign(parts)
        self.owned = self.owned - {p.partition for p in parts}

    def _loop(self, consumer: Consumer) -> None:
        try:
            while not self.stop.is_set():
                consumer.poll(0.05)
        finally:
            consumer.close()

    def close(self) -> None:
        """Leave the group (close() sends the leave) and wait for the thread."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(LIMIT_S)


def _until(condition: Any, started: float) -> float:
    deadline = started + LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            return float("nan")
        time.sleep(0.005)
    return time.monotonic() - started


def one_round(bootstrap: str, topic: str, protocol: dict[str, Any]) -> tuple[float, float, float]:
    """Join, second join and leave times (seconds) for a fresh group."""
    group = f"bench-groups-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    first = Member(bootstrap, group, topic, protocol).start()
    join = _until(lambda: bool(first.owned), t0)
    # Let the first member settle on every partition before the second arrives.
    _until(lambda: len(first.owned) == PARTITIONS, t0)
    t1 = time.monotonic()
    second = Member(bootstrap, group, topic, protocol).start()
    rejoin = _until(
        lambda: bool(second.owned) and not (first.owned & second.owned) and bool(first.owned), t1
    )
    t2 = time.monotonic()
    second.close()
    leave = _until(lambda: len(first.owned) == PARTITIONS, t2)
    first.close()
    return join, rejoin, leave


@contextlib.contextmanager
def running(engine: str) -> Iterator[str]:
    """A fresh broker of this engine for the measurement."""
    if engine == "kafka":
        with KafkaBroker() as kafka:
            yield kafka.bootstrap
    else:
        with LocalBroker() as tansu:
            yield tansu.bootstrap


def measure(engine: str, repeat: int) -> list[tuple[str, str, str, float, float]]:
    """Rows of (engine, protocol, measure, median s, max s)."""
    protocols = {"classic": CLASSIC} | ({"consumer (KIP-848)": KIP848} if engine == "kafka" else {})
    rows = []
    with running(engine) as bootstrap:
        topic = f"bench-groups-{uuid.uuid4().hex[:8]}"
        ensure_topics(Settings(bootstrap=bootstrap, topic=topic), [topic], PARTITIONS)
        for name, protocol in protocols.items():
            rounds = [one_round(bootstrap, topic, protocol) for _ in range(repeat)]
            for i, label in enumerate(("join", "second member joins", "member leaves")):
                values = [r[i] for r in rounds]
                rows.append((engine, name, label, statistics.median(values), max(values)))
    return rows


def main() -> None:
    """Measure and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", default="tansu,kafka")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = [r for engine in args.engines.split(",") for r in measure(engine, args.repeat)]
    print(f"Apache Kafka {KAFKA_VERSION}; {args.repeat} rounds each; seconds")
    print("| engine | protocol | measure | median s | max s |\n|---|---|---|---|---|")
    for engine, protocol, label, med, top in rows:
        print(f"| {engine} | {protocol} | {label} | {med:.2f} | {top:.2f} |")


if __name__ == "__main__":
    main()

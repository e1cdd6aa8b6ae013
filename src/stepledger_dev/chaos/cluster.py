"""Broker faults on an Apache Kafka cluster: a partition leader SIGKILLed, a broker SIGSTOPped.

Each fault starts from a healthy cluster (every partition of the step log has a leader and
its full ISR) and leaves one: a killed node is restarted on its storage and the fault waits
until it is back in every ISR, so two faults never overlap and ``min.insync.replicas=2`` of
three always holds for the agents' ``acks=all`` writes, apart from the fault's own window.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from stepledger.domain.events import Event
from stepledger.errors import BrokerError
from stepledger_dev.apache_kafka import KafkaBroker
from stepledger_dev.chaos.procs import wait_until

#: The launcher's brokers fence a silent node after 3 s (``broker.session.timeout.ms``).
PAUSE_S = 6.0
#: How long a healthy ISR may take to come back (a JVM start on a busy 2-core machine).
HEAL_TIMEOUT_S = 90.0
#: How long the agents write on the survivors before the killed node comes back.
DOWN_S = 2.0


def partitions(cluster: KafkaBroker, topic: str) -> dict[int, tuple[int, list[int]]]:
    """Each partition of ``topic`` as (leader, in-sync replicas), from cluster metadata."""
    from stepledger.config import Settings
    from stepledger.kafka.describe import ClusterView

    quiet = Settings(
        bootstrap=cluster.bootstrap, kafka={**cluster.client_settings, "log_level": "2"}
    )
    layout = ClusterView(quiet).layout(topic, timeout=5)
    return {p: (r.leader, list(r.in_sync)) for p, r in layout.topics.get(topic, {}).items()}


def fully_replicated(cluster: KafkaBroker, topic: str) -> bool:
    """True when every partition has a leader and all nodes in its ISR."""
    try:
        parts = partitions(cluster, topic)
    except Exception:  # a node is down: metadata may time out, which is "not yet"
        return False
    return bool(parts) and all(
        leader >= 0 and len(isr) == cluster.nodes for leader, isr in parts.values()
    )


def leader_moved(cluster: KafkaBroker, topic: str, gone: int) -> bool:
    """True when no partition is led by ``gone`` or leaderless."""
    try:
        return all(lead not in (gone, -1) for lead, _ in partitions(cluster, topic).values())
    except Exception:
        return False


@dataclass
class ClusterFaults:
    """The broker faults of one chaos run, serialized so that at most one node is down."""

    cluster: KafkaBroker
    topic: str
    rng: random.Random
    done: list[str] = field(default_factory=list)
    """What each fault did, e.g. ``sigkill node 2 (leader of partition 1)``."""
    windows: list[tuple[float, float]] = field(default_factory=list)
    """Each fault's window in epoch seconds: from the signal until the cluster healed."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def kill_leader(self) -> None:
        """SIGKILL the leader of a random step-log partition, then restart it."""
        with self._lock:
            partition, leader = self._healthy_leader()
            began = time.time()
            self.cluster.kill_node(leader)
            self.done.append(f"sigkill node {leader} (leader of partition {partition})")
            wait_until(lambda: leader_moved(self.cluster, self.topic, leader), 30, 0.2)
            time.sleep(DOWN_S)
            self.cluster.restart_node(leader, timeout=HEAL_TIMEOUT_S)
            self.done.append(f"restart node {leader}")
            self._wait_healthy()
            self.windows.append((began, time.time()))

    def stop_broker(self) -> None:
        """SIGSTOP a partition leader past the broker session timeout, then SIGCONT it."""
        with self._lock:
            partition, leader = self._healthy_leader()
            began = time.time()
            self.cluster.pause_node(leader)
            self.done.append(f"sigstop node {leader} (leader of partition {partition})")
            time.sleep(PAUSE_S)
            self.cluster.resume_node(leader)
            self.done.append(f"sigcont node {leader}")
            self._wait_healthy()
            self.windows.append((began, time.time()))

    def acked_during(self, events: list[Event], acked: set[str]) -> int:
        """How many acknowledged events were written inside a fault's window."""
        return sum(
            1
            for event in events
            if event.event_id in acked
            and any(a <= event.occurred_at.timestamp() <= b for a, b in self.windows)
        )

    def _healthy_leader(self) -> tuple[int, int]:
        self._wait_healthy()
        parts = partitions(self.cluster, self.topic)
        partition = self.rng.choice(sorted(parts))
        return partition, parts[partition][0]

    def _wait_healthy(self) -> None:
        if not wait_until(lambda: fully_replicated(self.cluster, self.topic), HEAL_TIMEOUT_S, 0.5):
            raise BrokerError(f"the cluster did not heal within {HEAL_TIMEOUT_S:.0f}s")

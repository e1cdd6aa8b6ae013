"""The fleet bench's cluster, workloads and agent processes (``bench.fleet`` and
``bench.fleet_daemons`` share them)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.common import broker, fresh_settings
from stepledger.config import Settings


@dataclass(frozen=True)
class Sizes:
    """One run's workload (full or quick)."""

    latency_steps: int = 1000
    processes: tuple[int, ...] = (1, 2, 4)
    agents: int = 32
    steps_per_agent: int = 60
    rounds: int = 2
    fresh_s: float = 30.0
    in_doubt: int = 1000
    doubt_processes: int = 4
    timeout_s: float = 15.0
    grace_s: float = 2.0


QUICK = Sizes(50, (1, 2), 8, 10, 1, 2.0, 30, 2, 4.0, 0.5)
LIMIT_S = 600.0


@dataclass
class Cluster:
    """Where the run measures: the bootstrap, the clients' extra settings, a label."""

    bootstrap: str
    kafka: dict[str, str] = field(default_factory=dict)
    label: str = ""

    def settings(self, partitions: int = 3) -> Settings:
        """Fresh topics on this cluster, with its client settings."""
        return fresh_settings(self.bootstrap, partitions=partitions, kafka=self.kafka)


@contextlib.contextmanager
def cluster(quick: bool, bootstrap: str | None) -> Iterator[Cluster]:
    """The given broker; else one Tansu node (quick) or the 3-node SASL Apache Kafka."""
    if bootstrap or quick:
        with broker(bootstrap) as servers:
            yield Cluster(servers, label="the given broker" if bootstrap else "Tansu, 1 node")
        return
    from stepledger_dev.apache_kafka import KafkaBroker
    from stepledger_dev.apache_kafka.secure import Security

    with KafkaBroker(nodes=3, security=Security()) as kafka:
        yield Cluster(
            kafka.bootstrap,
            kafka.client_settings,
            "Apache Kafka 4.4, 3 nodes, replication 3, min.insync.replicas=2, SASL/SCRAM",
        )


def agent_env(settings: Settings) -> dict[str, str]:
    """The environment a stepledger process reads these settings from (SASL included)."""
    env = {**os.environ, "STEPLEDGER_BOOTSTRAP": settings.bootstrap}
    env["STEPLEDGER_TOPIC"] = settings.topic
    for key, value in settings.kafka.items():
        env["STEPLEDGER_KAFKA_" + key.upper().replace(".", "_")] = value
    return env


def agent_process(settings: Settings, *args: object) -> subprocess.Popen[str]:
    """One ``bench.fleet_agent`` process with these arguments, on these settings."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_agent", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=agent_env(settings),
    )


def ready(procs: list[subprocess.Popen[str]], limit_s: float) -> None:
    """Wait (bounded) for each process's ``ready`` line."""
    deadline = time.monotonic() + limit_s
    for proc in procs:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if readable else ""
        if line.strip() != "ready":
            for other in procs:
                other.kill()
            raise SystemExit(f"bench.fleet: an agent process did not get ready ({line!r})")


def until(check: Any, what: str, limit_s: float = 120.0, quiet: bool = False) -> None:
    """Poll ``check`` (bounded); past the limit, stop the bench, or return if ``quiet``."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            if quiet:
                return
            raise SystemExit(f"bench.fleet: timed out waiting for {what}")
        time.sleep(0.05)

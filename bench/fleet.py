"""Performance as a fleet feels it: a replicated cluster, agent processes, freshness, decisions.

Every figure is a ratio against a baseline measured in the same run on the same cluster.
The cluster: a 3-node Apache Kafka (KRaft, ``stepledger_dev.apache_kafka``), replication 3,
``min.insync.replicas=2``, clients authenticated with SASL/SCRAM-SHA-512 (its ``Security``);
``--quick`` takes one Tansu node instead (the smoke exercises the code, it measures nothing),
``--bootstrap`` a broker you started (no SASL).  Four row groups (``bench.fleet_rows`` has
the rows' names and targets; docs/benchmarks.md, "A fleet", the budgets):

1. **Replicated step latency**: one agent's sequential steps (a keyed tool, 100-step
   workflows) interleaved with the raw two-acks floor (the step's intent and outcome bytes,
   each produced and awaited by confluent-kafka with the SDK's producer settings): p50, p99.
2. **Throughput with processes**: P = 1, 2, 4 agent processes of 32 asyncio agents each
   (``bench.fleet_agent rate``) against raw clients in as many processes at the same
   concurrency, rounds interleaved, all processes of a round started together; the client's
   CPU per step (Python's threads, librdkafka's) and the brokers' say where the CPU goes.
3. **Freshness**: agents at half the best stepledger rate of row 2 feed a ``stepledger
   project`` process in file mode; the time from each step's outcome acknowledgement to its
   row in the published snapshot, read as an analyst reads it (``stepledger.readers``).
4. **Time to decision**: N workflows in doubt (keyed with a query hook, compensatable,
   unkeyed: a third each) in agent processes all SIGKILLed at once; a recovery daemon
   (default grace, 2 s) decides each; from the log, each decision's time against its
   intent's deadline + grace.

``python -m bench.fleet [--quick] [--bootstrap HOST:PORT] [--json FILE]``; ``python -m bench
--only fleet`` runs it on the run's broker; ``--freshness RATE [--processes P]`` runs row 3
alone at RATE steps/s (half of what a full run sustained).  ``--diagnose`` runs row 2 alone
at 1 and 4 processes beside the same agents stepping a read-only tool (intent and outcome,
no claim read back): what the read-back costs the clients and the brokers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Producer

from bench import fleet_rows
from bench.common import Row, broker_pids, cpu_seconds, machine, table
from bench.concurrency import _step_records, act, warm_ledger
from bench.fleet_cluster import LIMIT_S, QUICK, Cluster, Sizes, agent_process, cluster, ready
from bench.fleet_daemons import freshness, time_to_decision
from bench.fleet_figures import span_rate
from bench.pg import postgres_cluster, postgres_missing
from bench.restate_peer import restate_missing, restate_running
from stepledger.config import Settings
from stepledger.kafka import DURABLE_PRODUCER

#: Seconds the brokers' idle CPU is sampled before each throughput round.
IDLE_S = 1.0


# -- 1. replicated step latency ----------------------------------------------------------------


def latency(settings: Settings, steps: int, warm: int) -> tuple[list[float], list[float]]:
    """Seconds per step: (raw two-acks floor, stepledger), interleaved step by step."""
    records = _step_records(settings)
    producer = Producer(settings.client_config(**DURABLE_PRODUCER))
    producer.produce(settings.topic, b"warm-up", b"warm-up")
    producer.flush(10)
    raw: list[float] = []
    ours: list[float] = []
    run = uuid.uuid4().hex[:6]
    with warm_ledger(settings) as ledger:
        wf = ledger.workflow(f"seq-{run}-0")
        for i in range(warm + steps):
            if i and i % 100 == 0:  # 100-step workflows: the open is not a step
                wf.finish()
                wf = ledger.workflow(f"seq-{run}-{i}")
            began = time.perf_counter()
            for key, value, headers in records:
                producer.produce(settings.topic, value, key, headers=headers)
                producer.flush(10)
            middle = time.perf_counter()
            wf.step(f"s{i}", act, i=i)
            ended = time.perf_counter()
            if i >= warm:
                raw.append(middle - began)
                ours.append(ended - middle)
        wf.finish()
    return raw, ours


# -- 2. throughput with processes --------------------------------------------------------------


def rate_round(
    where: Cluster, kind: str, processes: int, agents: int, steps: int, *extra: str
) -> dict[str, float]:
    """One round: ``processes`` agent processes started together; the aggregate figures."""
    settings = where.settings()
    procs = [agent_process(settings, "rate", kind, agents, steps, *extra) for _ in range(processes)]
    ready(procs, 120)
    brokers = broker_pids(where.bootstrap)
    # The brokers' own background (the controllers' quorum, heartbeats): measured idle for
    # IDLE_S and taken off, else it is charged to the steps, more to the slower side.
    idle = cpu_seconds(brokers)
    time.sleep(IDLE_S if brokers else 0.0)
    served = cpu_seconds(brokers)
    idle_per_s = (served - idle) / IDLE_S
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()  # every process starts now; communicate() closes stdin
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=LIMIT_S)
        if proc.returncode != 0:
            raise SystemExit(f"bench.fleet: a {kind} agent process failed ({proc.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    total = sum(r["steps"] for r in reports)
    span = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
    busy = cpu_seconds(brokers) - served - idle_per_s * span
    return {
        "rate": span_rate(reports),
        "python_us": sum(r["python_cpu"] for r in reports) / total * 1e6,
        "librdkafka_us": sum(r["librdkafka_cpu"] for r in reports) / total * 1e6,
        "broker_us": max(0.0, busy) / total * 1e6 if brokers else 0.0,
    }


def throughput(
    where: Cluster,
    sizes: Sizes,
    peers: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[int, dict[str, dict[str, float]]]:
    """Per process count, per kind (raw, stepledger, ``extra`` kinds of ``bench.fleet_agent
    rate``, and each of ``peers``: Restate at its ingress, DBOS at its system database's
    URL): the medians of the rounds."""
    found: dict[int, dict[str, dict[str, float]]] = {}
    peers = peers or {}
    kinds = ("raw", "stepledger", *extra, *peers)
    for processes in sizes.processes:
        rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(sizes.rounds):  # interleaved: every kind sees the same moments of load
            for kind in rounds:
                at = (peers[kind],) if kind in peers else ()
                rounds[kind].append(
                    rate_round(where, kind, processes, sizes.agents, sizes.steps_per_agent, *at)
                )
        found[processes] = {
            kind: {k: statistics.median(r[k] for r in figures) for k in figures[0]}
            for kind, figures in rounds.items()
        }
        print(f"[fleet] {processes} processes: {found[processes]}", flush=True)
    return found


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _peers(quick: bool, work: Path) -> Iterator[dict[str, str]]:
    """The throughput row's peers, each one node: Restate's ingress and DBOS's PostgreSQL
    system database, by kind; none with ``--quick``, nor one not installed (reason printed)."""
    found: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        missing = "not in --quick" if quick else restate_missing()
        if missing:
            print(f"[fleet] Restate left out: {missing}", flush=True)
        else:
            found["restate"] = stack.enter_context(restate_running(work)).ingress
        missing = "not in --quick" if quick else postgres_missing()
        if missing:
            print(f"[fleet] DBOS left out: {missing}", flush=True)
        else:
            url = f"{stack.enter_context(postgres_cluster())}/dbos_fleet"
            # Its schema made once, before P processes launch on it together.
            setup = [sys.executable, "-m", "bench.fleet_agent", "dbos-setup", url]
            subprocess.run(setup, check=True, timeout=120)
            found["dbos"] = url
        yield found


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """The four row groups on one cluster (see the module docstring)."""
    sizes = QUICK if quick else Sizes()
    rows: list[Row] = []
    with cluster(quick, bootstrap) as where, tempfile.TemporaryDirectory() as tmp:
        print(f"[fleet] cluster: {where.label}", flush=True)
        began = time.perf_counter()
        raw, ours = latency(where.settings(), sizes.latency_steps, sizes.latency_steps // 5)
        rows += fleet_rows.latency_rows(raw, ours)
        print(f"[fleet] latency done at {time.perf_counter() - began:.0f}s", flush=True)
        with _peers(quick, Path(tmp)) as peers:
            rates = throughput(where, sizes, peers)
        rows += fleet_rows.throughput_rows(rates, sizes.agents)
        print(f"[fleet] throughput done at {time.perf_counter() - began:.0f}s", flush=True)
        best = max(rates, key=lambda p: rates[p]["stepledger"]["rate"])
        sustained = rates[best]["stepledger"]["rate"]
        seen, missed, committed = freshness(where, sustained / 2, best, sizes, Path(tmp))
        rows += fleet_rows.freshness_rows(seen, missed, sustained, best, committed)
        print(f"[fleet] freshness done at {time.perf_counter() - began:.0f}s", flush=True)
        decided, expected = time_to_decision(where, sizes, Path(tmp))
        rows += fleet_rows.decision_rows(decided, expected, sizes.timeout_s, sizes.grace_s)
        print(f"[fleet] decisions done at {time.perf_counter() - began:.0f}s", flush=True)
    return rows


def fresh_only(
    rate: float, processes: int, quick: bool = False, bootstrap: str | None = None
) -> list[Row]:
    """Row 3 alone, at ``rate`` steps/s from ``processes`` agent processes (half a
    sustained rate a full run measured): the projector's changes measured quickly."""
    sizes = QUICK if quick else Sizes()
    with cluster(quick, bootstrap) as where, tempfile.TemporaryDirectory() as tmp:
        seen, missed, committed = freshness(where, rate, processes, sizes, Path(tmp))
    return fleet_rows.freshness_rows(seen, missed, rate * 2, processes, committed)


def diagnose(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Where row 2's CPU goes: 1 and 4 processes of keyed steps beside the same steps of a
    read-only tool (an intent and an outcome, no claim read back) and raw clients."""
    sizes = QUICK if quick else Sizes(processes=(1, 4))
    with cluster(quick, bootstrap) as where:
        rates = throughput(where, sizes, extra=("readonly",))
    return fleet_rows.diagnosis_rows(rates, sizes.agents)


def main() -> None:
    """``python -m bench.fleet``: the rows as a table, with the machine and its load."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny workloads on one Tansu node")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a cluster")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument(
        "--diagnose", action="store_true", help="only row 2, beside a read-only tool's steps"
    )
    parser.add_argument(
        "--freshness",
        type=float,
        metavar="STEPS_PER_S",
        help="only row 3, at this rate (half of a sustained rate a full run measured)",
    )
    parser.add_argument(
        "--processes", type=int, default=4, help="agent processes of --freshness (default 4)"
    )
    args = parser.parse_args()
    load, started = os.getloadavg()[0], time.time()
    if args.freshness:
        rows = fresh_only(args.freshness, args.processes, args.quick, args.bootstrap)
    else:
        measure = diagnose if args.diagnose else run
        rows = measure(quick=args.quick, bootstrap=args.bootstrap)
    print(
        f"\nmachine: {machine()}; quick={args.quick}; {time.time() - started:.0f}s in all; "
        f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}\n"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2))


if __name__ == "__main__":
    main()

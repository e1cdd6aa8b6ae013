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
--only fleet`` runs it on the run's broker.  ``--diagnose`` runs row 2 alone at 1 and 4
processes beside the same agents stepping a read-only tool (intent and outcome, no claim
read back): what the read-back costs the clients and the brokers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench import fleet_rows
from bench.common import Row, broker, broker_pids, cpu_seconds, fresh_settings, machine, table
from bench.concurrency import _step_records, act, warm_ledger
from bench.fleet_agent import doubt_tools
from bench.fleet_figures import DECIDING, Doubt, decisions, doubts, lags, span_rate
from bench.recovery import Running
from bench.restate_peer import restate_missing, restate_running
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.kafka import DURABLE_PRODUCER
from stepledger.kafka.reader import read_topic
from stepledger.readers.snapshots import connect_read_only, latest_snapshot
from stepledger.resolution.registry import ToolRegistry


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
#: Seconds the brokers' idle CPU is sampled before each throughput round.
IDLE_S = 1.0


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


def _agents(settings: Settings, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_agent", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=agent_env(settings),
    )


def _ready(procs: list[subprocess.Popen[str]], limit_s: float) -> None:
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
    procs = [_agents(settings, "rate", kind, agents, steps, *extra) for _ in range(processes)]
    _ready(procs, 120)
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
    where: Cluster, sizes: Sizes, restate: str | None = None, extra: tuple[str, ...] = ()
) -> dict[int, dict[str, dict[str, float]]]:
    """Per process count, per kind (raw, stepledger, Restate at its ``restate`` ingress if
    given, and ``extra`` kinds of ``bench.fleet_agent rate``): the medians of the rounds."""
    found: dict[int, dict[str, dict[str, float]]] = {}
    kinds = ("raw", "stepledger", *extra, *(("restate",) if restate else ()))
    for processes in sizes.processes:
        rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(sizes.rounds):  # interleaved: every kind sees the same moments of load
            for kind in rounds:
                extra = (restate,) if kind == "restate" and restate else ()
                rounds[kind].append(
                    rate_round(where, kind, processes, sizes.agents, sizes.steps_per_agent, *extra)
                )
        found[processes] = {
            kind: {k: statistics.median(r[k] for r in figures) for k in figures[0]}
            for kind, figures in rounds.items()
        }
        print(f"[fleet] {processes} processes: {found[processes]}", flush=True)
    return found


# -- 3. freshness ------------------------------------------------------------------------------

_SEEN = "SELECT workflow_id, step_id FROM steps WHERE status = 'succeeded' AND workflow_id LIKE ?"


def _watch(
    db: Path, prefix: str, seen: dict[tuple[str, str], float], stop: threading.Event
) -> None:
    """Note when each step of ``prefix`` first shows in the published snapshot (every 50 ms)."""
    while not stop.wait(0.05):
        snap = latest_snapshot(db)
        if snap is None:
            continue
        try:
            con = connect_read_only(snap)
        except Exception:  # replaced between listing and opening: the next poll reads it
            continue
        try:
            rows = con.execute(_SEEN, [f"{prefix}%"]).fetchall()
        except Exception:
            continue
        finally:
            con.close()
        now = time.time()
        for wf, step in rows:
            seen.setdefault((wf, step), now)


def freshness(
    where: Cluster, per_s: float, processes: int, sizes: Sizes, work: Path
) -> tuple[list[float], int, list[float]]:
    """(seconds from ack to visible for each step, steps never seen, each batch's commit
    lag from the projector's log) at ``per_s`` steps/s."""
    settings = where.settings()
    db, log = work / "fresh.duckdb", work / "projector.log"
    with open(log, "w") as err:
        projector = subprocess.Popen(
            [
                *(sys.executable, "-m", "stepledger", "project", "--db", str(db)),
                *("--log-format", "json", "--log-level", "DEBUG"),  # each batch's commit lag
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=agent_env(settings),
        )
    seen: dict[tuple[str, str], float] = {}
    stop = threading.Event()
    try:
        with warm_ledger(settings):  # one workflow, so the first snapshot shows the join done
            pass
        _until(lambda: latest_snapshot(db) is not None, "the projector's first snapshot")
        prefix = f"fresh-{uuid.uuid4().hex[:6]}"
        watcher = threading.Thread(target=_watch, args=(db, prefix, seen, stop), daemon=True)
        watcher.start()
        procs = [
            _agents(
                settings, "paced", sizes.agents, per_s / processes, sizes.fresh_s, f"{prefix}{p}"
            )
            for p in range(processes)
        ]
        acked: dict[tuple[str, str], float] = {}
        for proc in procs:
            out, _ = proc.communicate(timeout=LIMIT_S)
            if proc.returncode != 0:
                raise SystemExit(f"bench.fleet: a paced agent process failed ({proc.returncode})")
            acked.update({(wf, s): at for wf, s, at in json.loads(out.strip().splitlines()[-1])})
        _until(lambda: len(seen) >= len(acked), "every step in the snapshot", 30, quiet=True)
        stop.set()
        watcher.join(10)
    finally:
        stop.set()
        projector.send_signal(signal.SIGTERM)
        try:
            projector.wait(60)
        except subprocess.TimeoutExpired:
            projector.kill()
    return (*lags(acked, seen), commit_lags(log.read_text()))


def commit_lags(log: str) -> list[float]:
    """Each batch's lag, oldest event to committed in DuckDB, from the projector's JSON log:
    what the published snapshot adds to it is its interval and its copy.  The first batch
    is left out: it holds the warm-up workflow, written before the projector joined."""
    found = []
    for line in log.splitlines():
        if line.startswith("{") and '"lag_s"' in line:
            lag = json.loads(line).get("lag_s")
            if lag is not None:
                found.append(float(lag))
    return found[1:]


def _until(check: Any, what: str, limit_s: float = 120.0, quiet: bool = False) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            if quiet:
                return
            raise SystemExit(f"bench.fleet: timed out waiting for {what}")
        time.sleep(0.05)


# -- 4. time to decision ---------------------------------------------------------------------


def time_to_decision(where: Cluster, sizes: Sizes, work: Path) -> Any:
    """Kill every agent process with steps in doubt; the decisions, read from the log."""
    settings = where.settings()
    tools = doubt_tools(sizes.timeout_s)
    daemon = Running(settings, work / "recovery", ToolRegistry(list(tools)), grace_s=sizes.grace_s)
    daemon.caught_up_after()
    prefix = f"doubt-{uuid.uuid4().hex[:6]}"
    per = sizes.in_doubt // sizes.doubt_processes
    procs = [
        _agents(settings, "doubt", per, sizes.timeout_s, f"{prefix}-{p}")
        for p in range(sizes.doubt_processes)
    ]
    try:
        _ready(procs, 60 + sizes.timeout_s)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
    killed = time.time()
    expected = per * sizes.doubt_processes
    found: dict[tuple[str, str], Doubt] = {}
    limit = sizes.timeout_s + sizes.grace_s + 120
    try:
        for record in read_topic(settings, Codec(), follow=True, max_time=limit):
            event = record.event
            if event is None or not event.workflow_id.startswith(prefix):
                continue
            doubts([event], prefix, found)
            complete = isinstance(event.body, DECIDING) and len(found) >= expected
            if complete and all(d.decided_at is not None for d in found.values()):
                break
    finally:
        daemon.stop()
    first_deadline = min(d.deadline for d in found.values()).timestamp() if found else killed
    if killed > first_deadline:
        print("[fleet] agents were killed after the first deadline: raise timeout_s", flush=True)
    return decisions(found, sizes.grace_s), expected


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _restate(quick: bool, work: Path) -> Iterator[str | None]:
    """Restate's ingress for the throughput row's peer (one node), or None: not with
    ``--quick``, nor where it is not installed (the reason printed)."""
    missing = "not in --quick" if quick else restate_missing()
    if missing:
        print(f"[fleet] Restate left out: {missing}", flush=True)
        yield None
        return
    with restate_running(work) as restate:
        yield restate.ingress


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
        with _restate(quick, Path(tmp)) as restate:
            rates = throughput(where, sizes, restate)
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
    args = parser.parse_args()
    load, started = os.getloadavg()[0], time.time()
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

"""stepledger beside a peer: the same agent workload through DBOS Transact, same run.

Each system runs the same agent code through the API its users call by default:
stepledger's front door (``import stepledger as sl``: ``@sl.tool``, ``ledger.workflow(id)``,
``wf.step``, ``wf.finish``; asyncio: ``await ledger.aworkflow(id)``, ``await wf.astep``,
``await wf.afinish()`` with an ``async def`` tool) on the run's broker, and DBOS Transact 3.4
(``@DBOS.workflow``, ``@DBOS.step``) twice: with its default SQLite system database in a
temporary directory, and on PostgreSQL (its production setup: a throwaway cluster the bench
starts on loopback with ``fsync=on``, ``bench.pg``; skipped, with the reason printed, where
no PostgreSQL server binaries are installed), and Restate 1.7 (its server from the npm
package, the service on its Python SDK served by Hypercorn, agents as ingress clients:
``bench.restate_peer``; skipped where it is not installed, and with ``--quick``).  The tool
is the same trivial function (its cost is the systems' own).

- sequential step: one workflow, one step after another; p50 and p99 of a step's latency,
  after the same unmeasured warm-up for every system (``WARM_STEPS`` steps of another
  workflow: a broker, database or server started for the run is otherwise measured cold, and
  a fresh Apache Kafka JVM gave the first system measured a p50 of 7.8 ms against 1.7 ms on
  the same broker a run later);
- 8 and 64 threads: agents in one process, each running workflows of a few steps;
- 8 and 64 asyncio agents: the same as coroutines on one event loop;
- kill-and-resume: a 1,000-step workflow SIGKILLed inside step 500 (after the tool's effect,
  before anything recorded it); the time a new process takes to finish it, and the effects
  the tool counted twice.  stepledger's tool has a query hook (``policy="query"``) and its
  default ``timeout_s`` (30 s).

``pip install -e '.[bench]'`` brings DBOS, its PostgreSQL driver and Restate's Python SDK.
``python -m bench.peers [--quick]``
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stepledger as sl
from bench.common import (
    Row,
    agents_in_asyncio,
    agents_in_threads,
    broker,
    cli,
    fresh_settings,
    percentile,
)
from bench.peer_agent import effects
from bench.pg import postgres_cluster, postgres_missing
from bench.restate_peer import (
    restate_figures,
    restate_kill_and_resume,
    restate_missing,
    restate_running,
)


def _dbos() -> Any:
    try:
        import dbos
    except ImportError:
        raise SystemExit("bench.peers needs DBOS Transact: pip install -e '.[bench]'") from None
    return dbos


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """The bench's tool: the work is the systems' own."""
    return i


@sl.tool(keyed=True, name="act")
async def aact(i: int, *, idempotency_key: str) -> int:
    """The same tool for asyncio agents (DBOS's are ``async def`` steps too)."""
    return i


# -- stepledger --------------------------------------------------------------------------

# agents -> (workflows per agent, steps per workflow), full and quick.
Shape = dict[int, tuple[int, int]]
SHAPE: Shape = {8: (10, 20), 64: (2, 20)}
QUICK_SHAPE: Shape = {8: (2, 5), 64: (1, 2)}
#: Sequential steps each system runs before its sequential steps are measured (full, quick).
WARM_STEPS, QUICK_WARM_STEPS = 200, 5


def stepledger_figures(ledger: sl.Ledger, steps: int, shape: Shape, warm: int) -> dict[str, Any]:
    """Sequential latencies (after ``warm`` unmeasured steps), then steps/s of each count of
    threads and of asyncio agents."""
    run = uuid.uuid4().hex[:6]
    latencies = []
    warming = ledger.workflow(f"warm-{run}")
    for i in range(warm):
        warming.step(f"s{i}", act, i=i)
    warming.finish()
    wf = ledger.workflow(f"seq-{run}")
    for i in range(steps):
        began = time.perf_counter()
        wf.step(f"s{i}", act, i=i)
        latencies.append(time.perf_counter() - began)
    wf.finish()
    figures: dict[str, Any] = {"latencies": latencies}
    for agents, (workflows, size) in shape.items():

        def agent(index: int, workflows: int = workflows, size: int = size, n: int = agents) -> int:
            for w in range(workflows):
                wf = ledger.workflow(f"t{n}-{run}-{index}-{w}")
                for i in range(size):
                    wf.step(f"s{i}", act, i=i)
                wf.finish()
            return workflows * size

        async def async_agent(
            index: int, workflows: int = workflows, size: int = size, n: int = agents
        ) -> int:
            for w in range(workflows):
                wf = await ledger.aworkflow(f"a{n}-{run}-{index}-{w}")
                for i in range(size):
                    await wf.astep(f"s{i}", aact, i=i)
                await wf.afinish()
            return workflows * size

        figures[f"threads{agents}"] = agents_in_threads(agents, agent)
        figures[f"asyncio{agents}"] = agents_in_asyncio(agents, async_agent)
    return figures


# -- DBOS ----------------------------------------------------------------------------------


@contextmanager
def dbos_launched(url: str) -> Iterator[Any]:
    """DBOS launched on a fresh system database at ``url`` (its defaults), destroyed after."""
    dbos = _dbos()
    dbos.DBOS(config={"name": "peerbench", "system_database_url": url, "log_level": "WARNING"})
    dbos.DBOS.launch()
    try:
        yield dbos.DBOS
    finally:
        dbos.DBOS.destroy(destroy_registry=True)


def dbos_figures(url: str, steps: int, shape: Shape, warm: int) -> dict[str, Any]:
    """The same measurements through DBOS on the system database at ``url``."""
    DBOS = _dbos().DBOS
    latencies: list[float] = []

    # Registered anew for each launch: DBOS.destroy() drops its registry.
    @DBOS.step()
    def dbos_act(i: int) -> int:
        return i

    @DBOS.step()
    async def dbos_aact(i: int) -> int:
        return i

    @DBOS.workflow()
    def sequential(n: int) -> None:
        for i in range(n):
            began = time.perf_counter()
            dbos_act(i)
            latencies.append(time.perf_counter() - began)

    @DBOS.workflow()
    def work(n: int) -> int:
        return sum(dbos_act(i) for i in range(n))

    @DBOS.workflow()
    async def awork(n: int) -> int:
        return sum([await dbos_aact(i) for i in range(n)])

    with dbos_launched(url):
        sequential(warm)
        latencies.clear()
        sequential(steps)
        figures: dict[str, Any] = {"latencies": latencies}
        for agents, (workflows, size) in shape.items():

            def agent(index: int, workflows: int = workflows, size: int = size) -> int:
                for _ in range(workflows):
                    work(size)
                return workflows * size

            async def async_agent(index: int, workflows: int = workflows, size: int = size) -> int:
                for _ in range(workflows):
                    await awork(size)
                return workflows * size

            figures[f"threads{agents}"] = agents_in_threads(agents, agent)
            figures[f"asyncio{agents}"] = agents_in_asyncio(agents, async_agent)
        return figures


# -- kill and resume -------------------------------------------------------------------------


def kill_and_resume(system: str, workdir: Path, steps: int, where: list[str]) -> tuple[float, int]:
    """Seconds from starting a new process to the killed workflow's end, and effects re-run."""
    agent = [sys.executable, "-m", "bench.peer_agent", system]
    common = [str(workdir), str(steps), str(steps // 2)]
    died = subprocess.run([*agent, "die", *common, *where], capture_output=True, timeout=300)
    assert died.returncode == -9, died.stderr.decode()[-2000:]
    began = time.perf_counter()
    done = subprocess.run([*agent, "resume", *common, *where], capture_output=True, timeout=300)
    elapsed = time.perf_counter() - began
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = effects(workdir, system).read_text().splitlines()
    calls = [line.split()[0] for line in lines]
    assert set(calls) == {str(i) for i in range(steps)}, f"{system}: steps missing"
    return elapsed, len(calls) - steps


# -- the run ---------------------------------------------------------------------------------

SQLITE, POSTGRES, RESTATE = "DBOS-SQLite", "DBOS-Postgres", "Restate"


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Every figure of stepledger, DBOS on SQLite and on PostgreSQL, and Restate; the ratios."""
    if quick:
        return measure(bootstrap, 20, QUICK_SHAPE, 30, quick=True)
    return measure(bootstrap, 1000, SHAPE, 1000)


def measure(
    bootstrap: str | None, steps: int, shape: Shape, long_steps: int, quick: bool = False
) -> list[Row]:
    """The run at these sizes; ``quick`` leaves out what costs more to start than to measure."""
    peers: dict[str, dict[str, Any]] = {}
    warm = QUICK_WARM_STEPS if quick else WARM_STEPS
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = fresh_settings(servers)
        with sl.Ledger(settings, tools=[act]) as ledger:
            ours = stepledger_figures(ledger, steps, shape, warm)
        # The same agents with pipelined outcomes (docs/guarantees.md): its own rows.
        piped = sl.ResumeOptions(pipeline_outcomes=True)
        with sl.Ledger(fresh_settings(servers), tools=[act], options=piped) as ledger:
            ours[PIPELINED] = stepledger_figures(ledger, steps, shape, warm)
        where = [servers, fresh_settings(servers).topic]
        ours["resume"] = kill_and_resume("stepledger", work, long_steps, where)
        peers[SQLITE] = dbos_figures(f"sqlite:///{work / 'dbos.sqlite'}", steps, shape, warm)
        peers[SQLITE]["resume"] = kill_and_resume("dbos", work, long_steps, where)
        missing = postgres_missing()
        if missing:
            print(f"[peers] {POSTGRES} skipped: {missing}", flush=True)
        else:
            with postgres_cluster() as pg:
                peers[POSTGRES] = dbos_figures(f"{pg}/dbos_peers", steps, shape, warm)
                if quick:
                    # Two more DBOS processes (~2 s of imports and launch each): not in CI's smoke.
                    print(f"[peers] {POSTGRES} kill-and-resume skipped with --quick", flush=True)
                else:
                    peers[POSTGRES]["resume"] = kill_and_resume(
                        "dbos-postgres", work, long_steps, [f"{pg}/dbos_kill"]
                    )
        missing = (
            "its server, service and their imports cost ~5-10 s more: not in --quick"
            if quick
            else None
        )
        missing = missing or restate_missing()
        if missing:
            print(f"[peers] {RESTATE} skipped: {missing}", flush=True)
        else:
            with restate_running(work) as restate:
                peers[RESTATE] = restate_figures(restate, steps, shape, warm)
                peers[RESTATE]["resume"] = restate_kill_and_resume(restate, long_steps)
    return rows(ours, peers, shape, long_steps)


#: stepledger's figures with ``ResumeOptions(pipeline_outcomes=True)``.
PIPELINED = "(pipelined outcomes)"

# The targets, against DBOS on PostgreSQL (its production setup) and Restate; the
# first peer bench's (8 agents, SQLite) stay on the SQLite rows.
TARGETS = {
    (POSTGRES, "p50"): "<=0.35",
    (POSTGRES, "asyncio64"): ">=10",
    (RESTATE, "asyncio64"): ">=3",
    (SQLITE, "p50"): "<=0.3",
    (SQLITE, "threads8"): ">=10",
    (SQLITE, "asyncio8"): ">=10",
}


def rows(
    ours: dict[str, Any], peers: dict[str, dict[str, Any]], shape: Shape, long_steps: int
) -> list[Row]:
    """The result rows: stepledger's figure, each DBOS's as the baseline."""
    ms = 1000.0
    out: list[Row] = []
    variants = [("", ours)] + ([(f" {PIPELINED}", ours[PIPELINED])] if PIPELINED in ours else [])
    for peer, theirs in peers.items():
        for label, figures in variants:
            for q in (50, 99):
                out.append(
                    Row(
                        "peers",
                        f"sequential step p{q}{label} (vs {peer})",
                        percentile(figures["latencies"], q) * ms,
                        percentile(theirs["latencies"], q) * ms,
                        "ms",
                        TARGETS.get((peer, f"p{q}"), ""),
                        False,
                    )
                )
            for agents in shape:
                for kind, name in (("threads", "threads"), ("asyncio", "asyncio agents")):
                    key = f"{kind}{agents}"
                    out.append(
                        Row(
                            "peers",
                            f"{agents} {name}{label}, steps/s (vs {peer})",
                            figures[key],
                            theirs[key],
                            "steps/s",
                            TARGETS.get((peer, key), ""),
                        )
                    )
        if "resume" not in theirs:
            continue
        (our_s, our_rerun), (their_s, their_rerun) = ours["resume"], theirs["resume"]
        out.append(
            Row(
                "peers",
                f"kill-and-resume of a {long_steps}-step workflow: new process to done (vs {peer})",
                our_s,
                their_s,
                "s",
                "<=1",
                False,
            )
        )
        out.append(
            Row(
                "peers",
                f"  effects re-run after the kill (vs {peer})",
                our_rerun,
                their_rerun,
                "calls",
            )
        )
    return out


if __name__ == "__main__":
    cli(run, __doc__)

"""stepledger beside a peer: the same agent workload through DBOS Transact, same run.

Each system runs the same agent code through the API its users call by default:
stepledger's front door (``import stepledger as sl``: ``@sl.tool``, ``ledger.workflow(id)``,
``wf.step``, ``wf.finish``; asyncio: ``await ledger.aworkflow(id)``, ``await wf.astep``,
``await wf.afinish()`` with an ``async def`` tool) on the run's broker, and DBOS Transact 3.4
(``@DBOS.workflow``, ``@DBOS.step``) with its default SQLite system database in a temporary
directory.  The tool is the same trivial function (its cost is the systems' own).

- sequential step: one workflow, one step after another; p50 and p99 of a step's latency;
- 8 threads: 8 agents in one process, each running workflows of a few steps;
- 8 asyncio agents: the same as coroutines on one event loop;
- kill-and-resume: a 1,000-step workflow SIGKILLed inside step 500 (after the tool's effect,
  before anything recorded it); the time a new process takes to finish it, and the effects
  the tool counted twice.  stepledger's tool has a query hook (``policy="query"``) and its
  default ``timeout_s`` (30 s).

``pip install -e '.[bench]'`` brings DBOS.  ``python -m bench.peers [--quick]``
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stepledger as sl
from bench.common import Row, broker, cli, fresh_settings, percentile
from bench.peer_agent import effects

AGENTS = 8


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


def agents_in_threads(agent: Callable[[int], int]) -> float:
    """Steps per second of AGENTS threads, each running ``agent(index)`` (it returns its steps)."""
    counts = [0] * AGENTS

    def body(index: int) -> None:
        counts[index] = agent(index)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(AGENTS)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    elapsed = time.perf_counter() - began
    assert sum(counts) == AGENTS * counts[0] > 0, counts
    return sum(counts) / elapsed


def agents_in_asyncio(agent: Callable[[int], Any]) -> float:
    """Steps per second of AGENTS coroutines on one event loop."""

    async def all_agents() -> float:
        began = time.perf_counter()
        counts = await asyncio.gather(*(agent(n) for n in range(AGENTS)))
        elapsed = time.perf_counter() - began
        assert sum(counts) == AGENTS * counts[0] > 0, counts
        return float(sum(counts) / elapsed)

    return asyncio.run(all_agents())


# -- stepledger --------------------------------------------------------------------------


def stepledger_figures(ledger: sl.Ledger, steps: int, workflows: int, size: int) -> dict[str, Any]:
    """Sequential latencies, then steps/s of 8 threads and of 8 asyncio agents."""
    run = uuid.uuid4().hex[:6]
    latencies = []
    wf = ledger.workflow(f"seq-{run}")
    for i in range(steps):
        began = time.perf_counter()
        wf.step(f"s{i}", act, i=i)
        latencies.append(time.perf_counter() - began)
    wf.finish()

    def agent(index: int) -> int:
        for w in range(workflows):
            wf = ledger.workflow(f"t-{run}-{index}-{w}")
            for i in range(size):
                wf.step(f"s{i}", act, i=i)
            wf.finish()
        return workflows * size

    async def async_agent(index: int) -> int:
        for w in range(workflows):
            wf = await ledger.aworkflow(f"a-{run}-{index}-{w}")
            for i in range(size):
                await wf.astep(f"s{i}", aact, i=i)
            await wf.afinish()
        return workflows * size

    return {
        "latencies": latencies,
        "threads": agents_in_threads(agent),
        "asyncio": agents_in_asyncio(async_agent),
    }


# -- DBOS ----------------------------------------------------------------------------------


@contextmanager
def dbos_launched(workdir: Path) -> Iterator[Any]:
    """DBOS launched on a fresh SQLite system database (its defaults), destroyed after."""
    dbos = _dbos()
    url = f"sqlite:///{workdir / 'dbos.sqlite'}"
    dbos.DBOS(config={"name": "peerbench", "system_database_url": url, "log_level": "WARNING"})
    dbos.DBOS.launch()
    try:
        yield dbos.DBOS
    finally:
        dbos.DBOS.destroy()


def dbos_figures(workdir: Path, steps: int, workflows: int, size: int) -> dict[str, Any]:
    """The same three measurements through DBOS."""
    DBOS = _dbos().DBOS
    latencies: list[float] = []

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

    def agent(index: int) -> int:
        for _ in range(workflows):
            work(size)
        return workflows * size

    async def async_agent(index: int) -> int:
        for _ in range(workflows):
            await awork(size)
        return workflows * size

    with dbos_launched(workdir):
        sequential(steps)
        return {
            "latencies": latencies,
            "threads": agents_in_threads(agent),
            "asyncio": agents_in_asyncio(async_agent),
        }


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


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Every figure of both systems, then the ratios."""
    steps, workflows, size = (20, 2, 5) if quick else (1000, 10, 20)
    long_steps = 30 if quick else 1000
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = fresh_settings(servers)
        with sl.Ledger(settings, tools=[act]) as ledger:
            ledger.workflow("warm-up").finish()
            ours = stepledger_figures(ledger, steps, workflows, size)
        theirs = dbos_figures(work, steps, workflows, size)
        where = [servers, fresh_settings(servers).topic]
        ours["resume"] = kill_and_resume("stepledger", work, long_steps, where)
        theirs["resume"] = kill_and_resume("dbos", work, long_steps, where)
    return rows(ours, theirs, long_steps)


def rows(ours: dict[str, Any], theirs: dict[str, Any], long_steps: int) -> list[Row]:
    """The result rows: stepledger's figure, DBOS's as the baseline."""
    ms = 1000.0
    out = [
        Row(
            "peers",
            f"sequential step p{q} (vs DBOS)",
            percentile(ours["latencies"], q) * ms,
            percentile(theirs["latencies"], q) * ms,
            "ms",
            "<=0.3" if q == 50 else "",
            False,
        )
        for q in (50, 99)
    ]
    for key, name in (("threads", "8 threads"), ("asyncio", "8 asyncio agents")):
        out.append(
            Row("peers", f"{name}, steps/s (vs DBOS)", ours[key], theirs[key], "steps/s", ">=10")
        )
    (our_s, our_rerun), (their_s, their_rerun) = ours["resume"], theirs["resume"]
    out.append(
        Row(
            "peers",
            f"kill-and-resume of a {long_steps}-step workflow: new process to done (vs DBOS)",
            our_s,
            their_s,
            "s",
            "",
            False,
        )
    )
    out.append(
        Row("peers", "  effects re-run after the kill (vs DBOS)", our_rerun, their_rerun, "calls")
    )
    return out


if __name__ == "__main__":
    cli(run, __doc__)

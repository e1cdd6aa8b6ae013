"""One agent process of the fleet bench (``bench.fleet`` starts several and reads their output).

``python -m bench.fleet_agent MODE ARGS...``, its settings from the environment as every
stepledger process takes them (``STEPLEDGER_BOOTSTRAP``, ``STEPLEDGER_TOPIC``,
``STEPLEDGER_KAFKA_*`` for SASL):

- ``rate raw|stepledger|readonly|restate|dbos AGENTS STEPS [INGRESS|URL]``: connect and
  warm up, print ``ready``, wait for a line on stdin (every process of a round starts
  together), then run AGENTS asyncio agents of STEPS steps each: raw clients
  (``bench.concurrency.RawFloor``: two records a step, each awaited), stepledger
  (``bench.concurrency.stepledger_asyncio``: 10-step workflows; ``readonly``: the same with
  a read-only tool, which reads no claim back), Restate's ingress clients (10-step
  workflows, ``bench.peers``'s) or DBOS on the PostgreSQL system database at URL (10-step
  ``@DBOS.workflow``s of ``@DBOS.step``s, each process its own executor id, so no launch
  recovers another process's workflows).
  Prints one JSON line: the span's wall-clock start and end, the steps, and the process's
  CPU seconds in Python's threads and in librdkafka's.
- ``paced AGENTS RATE SECONDS PREFIX``: AGENTS agents make RATE steps/s together for
  SECONDS, 10-step workflows named PREFIX-..., and print one JSON line: every step's
  outcome acknowledgement time (``wf.astep`` returned), by workflow and step.
- ``dbos-setup URL``: launch DBOS once on the system database at URL (its schema made
  before the agent processes launch on it together), then destroy it.
- ``doubt COUNT TIMEOUT PREFIX``: COUNT workflows of one step each, the three kinds in turn
  (keyed with a query hook, compensatable, unkeyed), whose tool never returns; prints
  ``ready`` once every call is inside its tool (its intent acknowledged), then waits to be
  SIGKILLed.  :func:`doubt_tools` are the same tools for the recovery daemon, with hooks.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import stepledger as sl
from bench.common import thread_ticks
from bench.concurrency import STEPS, RawFloor, aact, stepledger_asyncio, warm_ledger
from bench.fleet_figures import paced_due
from stepledger.config import Settings, load_settings


def _found(args: dict[str, Any], idempotency_key: str) -> sl.Found:
    return sl.Found(args["i"])


def _undo(args: dict[str, Any], idempotency_key: str, result: Any) -> str:
    return "undone"


class _Hang:
    """The in-doubt tools' body: count the call in, then never return."""

    entered = 0
    everyone: asyncio.Event | None = None
    expected = 0

    @classmethod
    async def forever(cls) -> int:
        cls.entered += 1
        if cls.everyone is not None and cls.entered >= cls.expected:
            cls.everyone.set()
        await asyncio.Event().wait()
        return 0


def doubt_tools(timeout_s: float) -> tuple[sl.Tool, sl.Tool, sl.Tool]:
    """The three kinds of in-doubt step: keyed with a query hook, compensatable, unkeyed."""

    @sl.tool(name="fleet.charge", keyed=True, policy="query", query=_found, timeout_s=timeout_s)
    async def charge(i: int, *, idempotency_key: str) -> int:
        return await _Hang.forever()

    @sl.tool(name="fleet.book", compensate=_undo, timeout_s=timeout_s)
    async def book(i: int) -> int:
        return await _Hang.forever()

    @sl.tool(name="fleet.notify", timeout_s=timeout_s)
    async def notify(i: int) -> int:
        return await _Hang.forever()

    return charge, book, notify


def _thread_cpu() -> tuple[float, float]:
    """(CPU s of Python's threads, of librdkafka's threads) of this process so far."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    ticks = thread_ticks()
    kafka = sum(t for (_, name), t in ticks.items() if name.startswith("rdk:"))
    return (sum(ticks.values()) - kafka) / tick, kafka / tick


@sl.tool(name="fleet.look", read_only=True)
async def look(i: int) -> int:
    """A read-only tool: its steps write an intent and an outcome but read no claim back
    (docs/guarantees.md): the diagnostic beside the keyed tool's steps."""
    return i


def restate_agents(ingress: str, agents: int, steps: int) -> None:
    """Asyncio agents as Restate's ingress clients: each workflow one ``peer/work``
    invocation of STEPS steps (``bench.restate_service``), as ``bench.peers`` runs them."""
    import httpx

    limits = httpx.Limits(max_connections=agents, max_keepalive_connections=agents)

    async def every() -> None:
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:

            async def agent() -> None:
                for _ in range(steps // STEPS):
                    (await client.post(f"{ingress}/peer/work", json=STEPS)).raise_for_status()

            await asyncio.gather(*(agent() for _ in range(agents)))

    asyncio.run(every())


def dbos_launched(url: str, executor_id: str) -> Any:
    """DBOS on the system database at ``url`` as executor ``executor_id``; its asyncio
    agents' body (one 10-step workflow)."""
    from dbos import DBOS

    @DBOS.step()
    async def dbos_aact(i: int) -> int:
        return i

    @DBOS.workflow()
    async def awork(n: int) -> int:
        return sum([await dbos_aact(i) for i in range(n)])

    config: Any = {
        "name": "fleetbench",
        "system_database_url": url,
        "log_level": "WARNING",
        "executor_id": executor_id,
    }
    DBOS(config=config)
    DBOS.launch()
    return awork


def dbos_agents(awork: Any, agents: int, steps: int) -> None:
    """Asyncio agents of DBOS workflows of ``STEPS`` steps each, as ``bench.peers`` runs them."""

    async def every() -> None:
        async def agent() -> None:
            for _ in range(steps // STEPS):
                await awork(STEPS)

        await asyncio.gather(*(agent() for _ in range(agents)))

    asyncio.run(every())


def rate(settings: Settings, kind: str, agents: int, steps: int, *where: str) -> dict[str, Any]:
    """One round of the throughput row (see the module docstring)."""
    raw = RawFloor(settings) if kind == "raw" else None
    ledger = warm_ledger(settings) if kind in ("stepledger", "readonly") else None
    dbos = dbos_launched(where[0], f"fleet-{uuid.uuid4().hex[:12]}") if kind == "dbos" else None
    print("ready", flush=True)
    sys.stdin.readline()
    python, kafka = _thread_cpu()
    began = time.time()
    if raw is not None:
        raw.asyncio(agents, steps)
    elif ledger is not None:
        stepledger_asyncio(ledger, agents, steps, "start", look if kind == "readonly" else aact)
    elif dbos is not None:
        dbos_agents(dbos, agents, steps)
    else:
        restate_agents(where[0], agents, steps)
    ended = time.time()
    python_after, kafka_after = _thread_cpu()
    if raw is not None:
        raw.close()
    if ledger is not None:
        ledger.close()
    if dbos is not None:
        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)
    return {
        "began": began,
        "ended": ended,
        "steps": agents * steps,
        "python_cpu": python_after - python,
        "librdkafka_cpu": kafka_after - kafka,
    }


def paced(settings: Settings, agents: int, per_s: float, seconds: float, prefix: str) -> Any:
    """Steps at a steady rate; each step's acknowledgement time (see the module docstring)."""
    ledger = warm_ledger(settings)
    total = int(per_s * seconds)
    acked: list[tuple[str, str, float]] = []

    async def agent(k: int, start: float) -> None:
        n = 0
        while n * agents + k < total:
            wf = await ledger.astart(f"{prefix}-{k}-{n // STEPS}")
            for i in range(STEPS):
                if n * agents + k >= total:
                    break
                await asyncio.sleep(max(0.0, paced_due(start, per_s, agents, k, n) - time.time()))
                await wf.astep(f"s{i}", aact, i=i)
                acked.append((wf.workflow_id, f"s{i}", time.time()))
                n += 1
            await wf.afinish()

    async def every() -> None:
        start = time.time()
        await asyncio.gather(*(agent(k, start) for k in range(agents)))

    asyncio.run(every())
    ledger.close()
    return acked


def doubt(settings: Settings, count: int, timeout_s: float, prefix: str) -> None:
    """Steps left in doubt (see the module docstring); returns only if killed late."""
    tools = doubt_tools(timeout_s)
    ledger = warm_ledger(settings)
    _Hang.expected = count

    async def one(i: int) -> None:
        wf = await ledger.astart(f"{prefix}-{i}")
        await wf.astep("s0", tools[i % 3], i=i)

    async def every() -> None:
        _Hang.everyone = asyncio.Event()
        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        await asyncio.wait_for(_Hang.everyone.wait(), timeout_s)
        print("ready", flush=True)
        await asyncio.sleep(timeout_s * 10)  # the harness SIGKILLs this process first
        for task in tasks:
            task.cancel()

    asyncio.run(every())


def main(argv: list[str]) -> None:
    """Parse the arguments and run one agent process."""
    settings = load_settings({"producer_id": f"fleet-{uuid.uuid4().hex[:6]}"})
    mode = argv[0]
    if mode == "rate":
        figures = rate(settings, argv[1], int(argv[2]), int(argv[3]), *argv[4:])
        print(json.dumps(figures), flush=True)
    elif mode == "paced":
        acked = paced(settings, int(argv[1]), float(argv[2]), float(argv[3]), argv[4])
        print(json.dumps(acked), flush=True)
    elif mode == "dbos-setup":
        dbos_launched(argv[1], "fleet-setup")
        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)
    elif mode == "doubt":
        doubt(settings, int(argv[1]), float(argv[2]), argv[3])
    else:
        raise SystemExit(f"bench.fleet_agent: unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

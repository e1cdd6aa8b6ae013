"""Opening a workflow against starting one: what an open costs many agents, and one alone.

``ledger.workflow(id)`` must know whether the id is in the log: it waits for a catch-up of
the partition index (a fetch sent after the open began), where ``ledger.start(id)`` reads
nothing.  Rows, on one broker, interleaved so every variant sees the same moments of load:

- 32 agents (threads, then asyncio), 40 workflows of 10 steps each: steps/s of agents
  opening new ids and existing ids against agents starting them (target: at least 0.9,
  issue 24), and the process's CPU per step against start's;
- the same agents opening new ids: opens per catch-up of the index (how many share one),
  and (asyncio) the share of opens whose claim was read back on the event loop, from what
  the index's tail had fetched, instead of on a pool thread;
- one agent, opens of new ids in a row against starts: the process's CPU per call.

``python -m bench.opens --engine kafka`` (or ``python -m bench --only opens``).
"""

from __future__ import annotations

import time
import uuid

from bench.common import Row, broker, broker_pids, cli, fresh_settings
from bench.concurrency import (
    BROKERS,
    MODES,
    OPENS,
    STEPS,
    Figure,
    _median,
    stepledger_asyncio,
    stepledger_threads,
    warm_ledger,
)
from stepledger.history.kafka import KafkaHistory

AGENTS = 32
PER_AGENT = 400
ROUNDS = 5
ALONE = 300


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Every row above (``quick``: 4 agents, 20 steps each, one round, 20 calls alone)."""
    agents, per_agent, rounds, alone = (
        (4, 20, 1, 20) if quick else (AGENTS, PER_AGENT, ROUNDS, ALONE)
    )
    rows: list[Row] = []
    with broker(bootstrap) as servers:
        BROKERS[:] = broker_pids(servers)
        for mode in MODES:
            rows += _many(servers, mode, agents, per_agent, rounds)
        rows += _alone(servers, alone, rounds)
    for row in rows:
        print(f"[opens] {row.name}: {row.value:.1f} vs {row.baseline:.1f}", flush=True)
    return rows


def _many(servers: str, mode: str, agents: int, per_agent: int, rounds: int) -> list[Row]:
    figures: dict[str, list[Figure]] = {how: [] for how in ("start", *OPENS)}
    shared: list[float] = []
    for _ in range(rounds):
        for how in figures:
            with warm_ledger(fresh_settings(servers)) as ledger:
                agents_run = stepledger_threads if mode == "threads" else stepledger_asyncio
                figures[how].append(agents_run(ledger, agents, per_agent, how))
                history = ledger.history
                if how == "open new" and isinstance(history, KafkaHistory):
                    opens = agents * (per_agent // STEPS)
                    shared.append(opens / max(1, history.index.catch_ups))
    started = _median(figures["start"])
    rows = []
    for how in OPENS:
        opened = _median(figures[how])
        at = f"{agents} agents ({mode}): {how} id"
        rows.append(
            Row(
                "opens",
                f"{at}, steps/s (vs start)",
                opened.steps_per_s,
                started.steps_per_s,
                "steps/s",
                ">=0.9",
            )
        )
        rows.append(
            Row(
                "opens",
                f"{at}, client CPU per step (vs start)",
                opened.cpu_us,
                started.cpu_us,
                "us",
                higher_is_better=False,
            )
        )
    shared.sort()
    rows.append(
        Row(
            "opens",
            f"{agents} agents ({mode}): opens per catch-up, median",
            shared[len(shared) // 2],
            1.0,
            "opens",
        )
    )
    return rows


def _alone(servers: str, calls: int, rounds: int) -> list[Row]:
    spent: dict[str, list[float]] = {"start": [], "workflow": []}
    with warm_ledger(fresh_settings(servers)) as ledger:
        for _ in range(rounds):
            for how, times in spent.items():
                opener = getattr(ledger, how)
                ids = [uuid.uuid4().hex for _ in range(calls)]
                began = time.process_time()
                for wid in ids:
                    opener(wid)
                times.append((time.process_time() - began) / calls * 1e6)
    start, opened = sorted(spent["start"]), sorted(spent["workflow"])
    return [
        Row(
            "opens",
            "one agent: client CPU per open of a new id (vs start)",
            opened[len(opened) // 2],
            start[len(start) // 2],
            "us",
            higher_is_better=False,
        )
    ]


if __name__ == "__main__":
    cli(run, __doc__)

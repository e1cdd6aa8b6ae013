"""Agents on one event loop waiting for people never starve the others' waits on the log.

An approval wait blocks a thread for up to ``ResumeOptions.approval_wait_s``.  On asyncio's
default pool (min(32, cores + 4) threads: 6 on two cores) ten such waits held every thread,
and another agent's read back of its intent queued behind them until a person answered.
"""

from __future__ import annotations

import asyncio
import os

from stepledger.domain.tools import Tool
from stepledger.history.memory import InMemoryHistory
from stepledger.producer import approval
from tests.unit.resume_fakes import World

GATED = Tool(name="wire", effect="irreversible", requires_approval=True)
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: None)
WAITING = max(10, min(32, (os.cpu_count() or 1) + 4) + 2)  # more than the default pool holds


def test_ten_agents_awaiting_people_leave_another_agents_steps_running() -> None:
    world = World(approval_wait_s=30.0)
    ledger = world.ledger()

    def requested() -> int:
        return sum(e.type == "approval_requested" for e in world.log.events)

    async def gated(i: int) -> object:
        wf = await ledger.aworkflow(f"wf{i}")
        return await wf.astep("wire", GATED, {}, lambda a, k: f"wired-{i}")

    async def run() -> tuple[list[object], float]:
        loop = asyncio.get_running_loop()
        waits = [asyncio.create_task(gated(i)) for i in range(WAITING)]
        async with asyncio.timeout(20):
            while requested() < WAITING:
                await asyncio.sleep(0.01)
        # Every gated agent now holds a wait; an effectful step reads its intent back.
        started = loop.time()
        other = await ledger.aworkflow("other")
        async with asyncio.timeout(10):
            assert await other.astep("book", BOOK, {}, lambda a, k: "booked") == "booked"
        took = loop.time() - started
        assert not any(w.done() for w in waits)  # nobody answered yet
        reader = InMemoryHistory(world.log)
        for i in range(WAITING):
            approval.decide(ledger.log, ledger.events, reader, f"wf{i}", "wire", granted=True,
                            by="ops")  # fmt: skip
        async with asyncio.timeout(20):
            return list(await asyncio.gather(*waits)), took

    results, took = asyncio.run(run())
    assert results == [f"wired-{i}" for i in range(WAITING)]
    assert took < 10

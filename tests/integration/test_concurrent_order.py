"""Many agents of one process at once, on one producer: each workflow's records land in order.

Every record of the process goes through one idempotent client; a workflow's records are
keyed by its id, so they share a partition and land in the order sent, whether its steps
are awaited one by one or an outcome is pipelined ahead of the next intent.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import stepledger as sl
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.kafka.reader import read_topic

STEPS = 5
EXPECTED = [
    "workflow_started None",
    *(f"step_{kind} s{i}" for i in range(STEPS) for kind in ("intended", "outcome")),
    "workflow_finished None",
]


def _kinds_by_workflow(settings: Settings) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3, max_time=30):
        event = record.event
        assert event is not None
        kinds.setdefault(event.workflow_id, []).append(f"{event.type} {event.step_id}")
    return kinds


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_asyncio_agents_write_each_workflow_in_order(settings: Settings, pipelined: bool) -> None:
    options = sl.ResumeOptions(pipeline_outcomes=pipelined)

    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
        return i

    async def agents(ledger: sl.Ledger) -> None:
        async def one(n: int) -> None:
            wf = await ledger.astart(f"agent-{n}")
            for i in range(STEPS):
                assert await wf.astep(f"s{i}", act, i=i) == i
            await wf.afinish()

        await asyncio.gather(*(one(n) for n in range(12)))

    with sl.Ledger(settings, tools=[act], options=options) as ledger:
        asyncio.run(agents(ledger))
    kinds = _kinds_by_workflow(settings)
    assert sorted(kinds) == sorted(f"agent-{n}" for n in range(12))
    for workflow, seen in kinds.items():
        assert seen == EXPECTED, workflow


@pytest.mark.parametrize("pipelined", [False, True], ids=["default", "pipelined"])
def test_threads_write_each_workflow_in_order(settings: Settings, pipelined: bool) -> None:
    options = sl.ResumeOptions(pipeline_outcomes=pipelined)

    @sl.tool(keyed=True, name="act")
    def act(i: int, *, idempotency_key: str) -> int:
        return i

    with sl.Ledger(settings, tools=[act], options=options) as ledger:

        def one(n: int) -> None:
            wf = ledger.start(f"agent-{n}")
            for i in range(STEPS):
                assert wf.step(f"s{i}", act, i=i) == i
            wf.finish()

        threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
    kinds = _kinds_by_workflow(settings)
    assert sorted(kinds) == sorted(f"agent-{n}" for n in range(8))
    for workflow, seen in kinds.items():
        assert seen == EXPECTED, workflow

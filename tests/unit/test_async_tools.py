"""``@sl.tool`` on an ``async def``: awaited by ``astep``, refused by ``step``, re-driven too.

Before, the decorator wrapped the coroutine function in a plain function: ``astep`` ran
it on a thread, got a coroutine back, never awaited it, and recorded that as the outcome.
"""

from __future__ import annotations

import asyncio

import pytest

import stepledger as sl
from stepledger.domain import events as ev
from stepledger.errors import ToolDefinitionError
from stepledger.kafka import Position
from stepledger.testing import Crash, InMemoryEventLog, ManualClock, ledger_over

CALLS: list[str] = []


@sl.tool(keyed=True)
async def reserve(seats: int, *, idempotency_key: str) -> int:
    await asyncio.sleep(0)
    CALLS.append(idempotency_key)
    return seats


def test_astep_awaits_an_async_tool_and_a_replay_returns_its_result() -> None:
    log = InMemoryEventLog()
    CALLS.clear()

    async def run() -> int:
        return int(await ledger_over(log).workflow("w").astep("r", reserve, seats=2))

    assert asyncio.run(run()) == 2 and len(CALLS) == 1
    assert asyncio.run(run()) == 2 and len(CALLS) == 1  # replayed, not called
    outcome = [e for e in log.workflow_events("w") if e.type == "step_outcome"]
    body = outcome[0].body
    assert isinstance(body, ev.StepOutcome) and body.result_json == "2"


def test_step_refuses_an_async_tool_before_recording_anything() -> None:
    log = InMemoryEventLog()
    wf = ledger_over(log).workflow("w")
    with pytest.raises(ToolDefinitionError, match="astep"):
        wf.step("r", reserve, seats=2)
    assert [e.type for e in log.workflow_events("w")] == ["workflow_started"]


def test_astep_refuses_a_tool_without_a_run_hook_before_recording_anything() -> None:
    # Before, astep looked the run hook up only after the intent was acknowledged: the
    # refused call left an intent in doubt behind it (step refused it before any record).
    log = InMemoryEventLog()
    hookless = sl.Tool(name="hookless", effect="idempotent", keyed=True)

    async def run() -> None:
        await ledger_over(log).workflow("w").astep("h", hookless)

    with pytest.raises(ToolDefinitionError, match="no run hook"):
        asyncio.run(run())
    assert [e.type for e in log.workflow_events("w")] == ["workflow_started"]


def test_recovery_redrives_an_async_tool_by_awaiting_it() -> None:
    log, clock = InMemoryEventLog(), ManualClock()
    CALLS.clear()

    @sl.tool(keyed=True, name="reserve")
    async def crashing(seats: int, *, idempotency_key: str) -> int:
        raise Crash

    async def first() -> None:
        await ledger_over(log, clock=clock).workflow("w").astep("r", crashing, seats=3)

    with pytest.raises(Crash):
        asyncio.run(first())
    clock.advance(60)
    wf = ledger_over(log, tools=[reserve], clock=clock).workflow("w")  # re-drives with the key
    assert wf.state.steps["r"].status.value == "succeeded" and len(CALLS) == 1
    assert wf.state.steps["r"].result_json == "3"


def test_aworkflow_and_afinish_open_and_end_a_workflow_from_a_coroutine() -> None:
    log = InMemoryEventLog()

    async def run() -> None:
        ledger = ledger_over(log)
        wf = await ledger.aworkflow("w", name="trip")
        await wf.astep("r", reserve, seats=1)
        await wf.afinish()
        await wf.afinish()  # ending it again the same way writes nothing
        again = await ledger.aworkflow("w")
        assert again.finished and await again.astep("r", reserve, seats=1) == 1

    asyncio.run(run())
    types = [e.type for e in log.workflow_events("w")]
    assert types == ["workflow_started", "step_intended", "step_outcome", "workflow_finished"]


class _WhereAppended(InMemoryEventLog):
    """Notes each event type with the way it was appended: on the loop or from a thread."""

    def __init__(self) -> None:
        super().__init__()
        self.ways: list[tuple[str, str]] = []

    def append(self, event: ev.Event) -> Position:
        self.ways.append((event.type, "thread"))
        return super().append(event)

    async def append_async(self, event: ev.Event) -> Position:
        self.ways.append((event.type, "loop"))
        return super().append(event)


def test_aworkflow_records_a_first_run_on_the_loop_and_a_resume_off_it() -> None:
    """A new id's start goes the way ``astart``'s does (it may share a request under load);
    a resume's claim and settling stay off the loop, as blocking reads do."""
    log = _WhereAppended()

    async def run() -> None:
        ledger = ledger_over(log)
        await ledger.aworkflow("w", name="trip")
        await ledger.aworkflow("w")  # the log holds it, unfinished: a resume claims it

    asyncio.run(run())
    assert log.ways == [("workflow_started", "loop"), ("workflow_resumed", "thread")]

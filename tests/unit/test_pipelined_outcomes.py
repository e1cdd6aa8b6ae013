"""Pipelined outcomes (``ResumeOptions(pipeline_outcomes=True)``) over a log whose acks we hold.

What must hold: the next call is made only once the previous outcome is acknowledged; the
next event is sent before that wait (so the two waits overlap and land in order); a lost
outcome is raised by the next call on the handle, which then refuses further use; reads of
the log by the handle see the outcome; without the option nothing changes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import stepledger as sl
from stepledger.domain import events as ev
from stepledger.domain.state import StepStatus
from stepledger.errors import DurabilityError
from stepledger.kafka import Position
from stepledger.log import Acknowledgement, InMemoryEventLog
from stepledger.producer import Ledger
from stepledger.producer.session import ResumeOptions

PIPELINED = ResumeOptions(pipeline_outcomes=True)


class HeldAcks(InMemoryEventLog):
    """An in-memory log that records each event when it is sent and says when it was acked.

    ``lose`` names an event type whose (pipelined) acknowledgement fails.  ``journal`` is the
    order of everything that happened: ``sent <type>``, ``acked <type>``, ``call <step>``.
    """

    def __init__(self, journal: list[str], lose: str | None = None) -> None:
        super().__init__()
        self.journal = journal
        self.lose = lose

    def append(self, event: ev.Event) -> Position:
        self.journal.append(f"sent {_name(event)}")
        position = super().append(event)
        self.journal.append(f"acked {_name(event)}")
        return position

    def send(self, event: ev.Event) -> Acknowledgement:
        self.journal.append(f"sent {_name(event)}")
        position = super().append(event)

        def acknowledged() -> Position:
            if event.type == self.lose:
                raise DurabilityError("record not acknowledged: broker gone")
            self.journal.append(f"acked {_name(event)}")
            return position

        return acknowledged

    def send_async(self, event: ev.Event) -> asyncio.Future[Position]:
        self.journal.append(f"sent {_name(event)}")
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        position = super().append(event)

        def settle() -> None:
            if event.type == self.lose:
                future.set_exception(DurabilityError("record not acknowledged: broker gone"))
            else:
                self.journal.append(f"acked {_name(event)}")
                future.set_result(position)

        asyncio.get_running_loop().call_soon(settle)
        return future


def _name(event: ev.Event) -> str:
    return event.type if event.step_id is None else f"{event.type} {event.step_id}"


def _ledger(journal: list[str], options: ResumeOptions = PIPELINED, **log: Any) -> Ledger:
    return Ledger(log=HeldAcks(journal, **log), options=options)


def _tool(journal: list[str]) -> sl.Tool:
    @sl.tool(keyed=True, name="act")
    def act(i: int, *, idempotency_key: str) -> int:
        journal.append(f"call s{i}")
        return i

    return act


def test_the_next_call_waits_for_the_outcome_and_the_next_intent_is_sent_first() -> None:
    journal: list[str] = []
    act = _tool(journal)
    wf = _ledger(journal).start("wf")
    journal.clear()
    assert wf.step("s1", act, i=1) == 1
    # step returned with its outcome sent, folded, not yet acknowledged
    assert journal == ["sent step_intended s1", "acked step_intended s1", "call s1",
                       "sent step_outcome s1"]  # fmt: skip
    assert wf.state.steps["s1"].status is StepStatus.SUCCEEDED
    wf.step("s2", act, i=2)
    wf.finish()
    assert journal == [
        "sent step_intended s1", "acked step_intended s1", "call s1", "sent step_outcome s1",
        # the next intent leaves before the outcome's wait; both acked before the call
        "sent step_intended s2", "acked step_outcome s1", "acked step_intended s2", "call s2",
        "sent step_outcome s2", "sent workflow_finished", "acked step_outcome s2",
        "acked workflow_finished",
    ]  # fmt: skip


def test_without_the_option_each_outcome_is_acknowledged_before_step_returns() -> None:
    journal: list[str] = []
    act = _tool(journal)
    wf = _ledger(journal, ResumeOptions()).start("wf")
    journal.clear()
    wf.step("s1", act, i=1)
    assert journal[-2:] == ["sent step_outcome s1", "acked step_outcome s1"]


def test_a_lost_outcome_is_raised_by_the_next_step_whose_tool_is_not_called() -> None:
    journal: list[str] = []
    act = _tool(journal)
    wf = _ledger(journal, lose="step_outcome").start("wf")
    wf.step("s1", act, i=1)
    with pytest.raises(DurabilityError, match="outcome of step 's1' was not acknowledged"):
        wf.step("s2", act, i=2)
    assert "call s2" not in journal
    # the handle refuses further use: its state holds an outcome the log may not
    with pytest.raises(DurabilityError, match="open the workflow again"):
        wf.finish()
    assert "sent workflow_finished" not in journal


def test_reading_the_log_settles_the_outcome_first() -> None:
    journal: list[str] = []
    act = _tool(journal)
    wf = _ledger(journal).start("wf")
    wf.step("s1", act, i=1)
    assert journal[-1] == "sent step_outcome s1"
    wf.reload()
    assert journal[-1] == "acked step_outcome s1"
    assert wf.state.steps["s1"].status is StepStatus.SUCCEEDED


def test_asyncio_steps_pipeline_the_same_way() -> None:
    journal: list[str] = []

    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
        journal.append(f"call s{i}")
        return i

    async def run() -> None:
        ledger = _ledger(journal)
        wf = await ledger.astart("wf")
        journal.clear()
        await wf.astep("s1", act, i=1)
        assert journal[-1] == "sent step_outcome s1"
        await wf.astep("s2", act, i=2)
        await wf.afinish()

    asyncio.run(run())
    assert journal.index("sent step_intended s2") < journal.index("acked step_outcome s1")
    assert journal.index("acked step_outcome s1") < journal.index("call s2")
    assert journal[-1] == "acked workflow_finished"


def test_an_asyncio_lost_outcome_is_raised_by_the_next_step() -> None:
    journal: list[str] = []

    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
        journal.append(f"call s{i}")
        return i

    async def run() -> None:
        wf = await _ledger(journal, lose="step_outcome").astart("wf")
        await wf.astep("s1", act, i=1)
        with pytest.raises(DurabilityError, match="outcome of step 's1'"):
            await wf.astep("s2", act, i=2)

    asyncio.run(run())
    assert "call s2" not in journal


def test_a_blocking_wait_from_another_thread_settles_an_asyncio_outcome() -> None:
    """An asyncio handle whose outcome a helper thread must see (settling runs off the loop)."""
    journal: list[str] = []

    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
        return i

    async def run() -> None:
        wf = await _ledger(journal).astart("wf")
        await wf.astep("s1", act, i=1)
        done = threading.Event()
        # the future settles on this loop; the thread's blocking wait must not deadlock
        await asyncio.to_thread(lambda: (wf.settle_pending(), done.set()))
        assert done.is_set() and journal[-1] == "acked step_outcome s1"

    asyncio.run(run())

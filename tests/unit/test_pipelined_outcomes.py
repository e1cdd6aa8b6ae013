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


def _atool(journal: list[str]) -> sl.Tool:
    @sl.tool(keyed=True, name="act")
    async def act(i: int, *, idempotency_key: str) -> int:
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

    act = _atool(journal)

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
    # (this fake acks an append at once; on the broker the outcome's report comes first)
    assert set(journal[-2:]) == {"acked step_outcome s2", "acked workflow_finished"}


def test_an_asyncio_lost_outcome_is_raised_by_the_next_step() -> None:
    journal: list[str] = []

    act = _atool(journal)

    async def run() -> None:
        wf = await _ledger(journal, lose="step_outcome").astart("wf")
        await wf.astep("s1", act, i=1)
        with pytest.raises(DurabilityError, match="outcome of step 's1'"):
            await wf.astep("s2", act, i=2)

    asyncio.run(run())
    assert "call s2" not in journal


class SlowAcks(HeldAcks):
    """Acks that come ``delay_s`` after the send, from another thread (as the producer's)."""

    def __init__(self, journal: list[str], delay_s: float) -> None:
        super().__init__(journal)
        self.delay_s = delay_s

    def send(self, event: ev.Event) -> Acknowledgement:
        self.journal.append(f"sent {_name(event)}")
        position = InMemoryEventLog.append(self, event)
        acked = threading.Event()

        def ack() -> None:
            self.journal.append(f"acked {_name(event)}")
            acked.set()

        threading.Timer(self.delay_s, ack).start()

        def acknowledged() -> Position:
            if not acked.wait(10):
                raise DurabilityError("no acknowledgement within 10s")
            return position

        return acknowledged

    async def append_async(self, event: ev.Event) -> Position:
        return await asyncio.to_thread(self.send(event))


def test_a_lost_outcome_also_stops_replays_and_read_only_reruns() -> None:
    journal: list[str] = []
    act = _tool(journal)

    @sl.tool(read_only=True, name="look")
    def look(i: int) -> int:
        journal.append(f"look {i}")
        return i

    ledger = _ledger(journal, lose="step_outcome")
    first = ledger.start("wf")

    def interrupted(args: dict[str, Any], key: str) -> int:
        raise KeyboardInterrupt  # the run dies inside the read: it stays intended

    with pytest.raises(KeyboardInterrupt):
        first.step("r", look, i=9, fn=interrupted)
    wf = ledger.workflow("wf")
    wf.fast_forward()
    wf.step("s1", act, i=1)
    with pytest.raises(DurabilityError):
        wf.step("s2", act, i=2)
    journal.clear()
    with pytest.raises(DurabilityError, match="open the workflow again"):
        wf.step("s1", act, i=1)  # a replay of a step the handle recorded
    with pytest.raises(DurabilityError, match="open the workflow again"):
        wf.step("r", look, i=9)  # a read-only re-run
    with pytest.raises(DurabilityError):
        wf.reload()
    assert journal == []


def test_a_sync_step_on_the_event_loop_after_an_astep_settles_the_outcome() -> None:
    """The pending wait is thread-safe: no event loop has to run for it."""
    journal: list[str] = []
    sync_act = _tool(journal)

    act = _atool(journal)

    async def run() -> None:
        wf = await sl.Ledger(log=SlowAcks(journal, 0.05), options=PIPELINED).astart("wf")
        await wf.astep("s1", act, i=1)
        wf.step("s2", sync_act, i=2)  # on the loop thread, outcome of s1 still in flight
        assert journal.index("acked step_outcome s1") < journal.index("call s2")

    asyncio.run(run())


def test_after_the_loop_is_gone_a_sync_step_settles_the_outcome() -> None:
    journal: list[str] = []
    sync_act = _tool(journal)

    act = _atool(journal)

    ledger = sl.Ledger(log=SlowAcks(journal, 0.2), options=PIPELINED)

    async def run() -> Any:
        wf = await ledger.astart("wf")
        await wf.astep("s1", act, i=1)
        return wf

    wf = asyncio.run(run())  # the loop closes with s1's outcome unacknowledged
    wf.step("s2", sync_act, i=2)
    assert journal.index("acked step_outcome s1") < journal.index("call s2")


def test_a_cancelled_astep_leaves_the_outcome_pending_for_the_next_call() -> None:
    journal: list[str] = []

    act = _atool(journal)

    async def run() -> None:
        wf = await sl.Ledger(log=SlowAcks(journal, 0.2), options=PIPELINED).astart("wf")
        await wf.astep("s1", act, i=1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wf.astep("s2", act, i=2), 0.05)
        await wf.astep("s3", act, i=3)

    asyncio.run(run())
    assert "call s2" not in journal
    assert journal.index("acked step_outcome s1") < journal.index("call s3")


def test_a_new_approval_step_after_a_pipelined_astep_asks_for_approval() -> None:
    journal: list[str] = []

    act = _atool(journal)

    wire = sl.Tool(name="wire", effect="irreversible", keyed=True, requires_approval=True)

    async def run() -> None:
        wf = await sl.Ledger(log=SlowAcks(journal, 0.05), options=PIPELINED).astart("wf")
        await wf.astep("s1", act, i=1)
        with pytest.raises(sl.ApprovalPendingError):
            await wf.astep("pay", wire, amount=5, fn=lambda a, k: 1)

    asyncio.run(run())
    assert "acked step_outcome s1" in journal

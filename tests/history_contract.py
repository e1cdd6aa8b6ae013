"""What every :class:`~stepledger.history.protocol.WorkflowHistory` answers, whatever holds the log.

Run against the in-memory history (tests/unit/test_history_contract.py) and the Kafka one on
the broker under test (tests/integration/test_history_contract.py): a ledger writes, the
history made for the same step log reads.
"""

from __future__ import annotations

import threading

from stepledger.domain.tools import Tool
from stepledger.history.protocol import WorkflowHistory
from stepledger.producer import Ledger, Workflow

PAY = Tool(name="pay", keyed=True)


def _pay(ledger: Ledger, workflow_id: str, n: int) -> Workflow:
    wf = ledger.start(workflow_id)
    wf.step("pay", PAY, {"n": n}, lambda a, k: a["n"])
    return wf


def an_unwritten_id_has_no_events_and_that_is_its_whole_history(
    ledger: Ledger, history: WorkflowHistory
) -> None:
    _pay(ledger, "other", 1)
    found = history.read("nobody")
    assert found.events == [] and found.whole


def a_workflow_reads_as_its_own_events_in_log_order(
    ledger: Ledger, history: WorkflowHistory
) -> None:
    mine = _pay(ledger, "a", 1)
    _pay(ledger, "b", 2)
    mine.finish()
    found = history.read("a")
    types = [e.type for e in found.events]
    assert types == [
        "workflow_started",
        "step_intended",
        "step_outcome",
        "workflow_finished",
    ], types
    assert {e.workflow_id for e in found.events} == {"a"} and found.whole


def a_read_through_an_own_record_holds_it_and_what_came_before(
    ledger: Ledger, history: WorkflowHistory
) -> None:
    wf = ledger.start("t")
    wf.finish()
    position = wf.position
    assert position is not None
    found = history.read("t", through=position)
    assert [e.type for e in found.events][-1] == "workflow_finished"


def a_hint_never_contradicts_what_this_process_wrote(
    ledger: Ledger, history: WorkflowHistory
) -> None:
    wf = ledger.start("h")
    wf.finish()
    assert wf.position is not None
    history.wrote("h", wf.position)
    known = history.known("h")
    assert known is None or [e.type for e in known.events][-1:] == ["workflow_finished"]
    whole = history.read("h").events
    assert known is None or len(known.events) <= len(whole)


def follow_waits_for_the_next_events_after_a_position(
    ledger: Ledger, history: WorkflowHistory
) -> None:
    wf = ledger.start("f")
    after = wf.position
    later = threading.Timer(0.2, wf.finish)
    later.start()
    try:
        found = history.follow("f", after, lambda e: e.type == "workflow_finished", 30.0)
    finally:
        later.join()
    assert [e.type for e in found] == ["workflow_finished"]


CONTRACT = (
    an_unwritten_id_has_no_events_and_that_is_its_whole_history,
    a_workflow_reads_as_its_own_events_in_log_order,
    a_read_through_an_own_record_holds_it_and_what_came_before,
    a_hint_never_contradicts_what_this_process_wrote,
    follow_waits_for_the_next_events_after_a_position,
)

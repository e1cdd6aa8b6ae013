"""An operator's cancel or restart claims the workflow without spending its attempts (in memory).

Carrying a cancel or a restart through opens the workflow as a runner: a claim, which fences
off the runner that held it.  The claim names the operator (``workflow_resumed.operator``)
and the fold moves the limit with it, so a workflow at its limit of resumption attempts is
claimed by the operator instead of dead-lettered, and its own runners keep the attempts
they had.
"""

from __future__ import annotations

from typing import Any

from stepledger.domain import events as ev
from stepledger.domain import operators, restart
from stepledger.domain.state import RunStatus, replay
from stepledger.domain.tools import Tool
from stepledger.humanqueue.operators import carry_cancel, carry_restart, operator_open
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over
from tests.unit.factories import factory


def book(calls: list[str]) -> Tool:
    def run(args: dict[str, Any], key: str) -> str:
        calls.append(f"book:{key}")
        return "booked"

    def undo(args: dict[str, Any], key: str, result: Any) -> None:
        calls.append(f"undo:{key}")

    return Tool(name="book", effect="compensatable", keyed=True, run=run, compensate=undo)


def at_its_limit(log: InMemoryEventLog, tool: Tool) -> None:
    """A workflow that used its only attempt: a runner's next open dead-letters it."""
    ledger_over(log, tools=[tool]).workflow("wf", max_attempts=1).step("hotel", tool, hotel="A")


def claims(log: InMemoryEventLog) -> list[ev.WorkflowResumed]:
    return [e.body for e in log.workflow_events("wf") if isinstance(e.body, ev.WorkflowResumed)]


def test_a_cancel_of_a_workflow_at_its_limit_is_carried_through_not_dead_lettered() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    tool = book(calls)
    at_its_limit(log, tool)
    asked = operators.request_cancel(replay("wf", log.workflow_events("wf")), "ops", "r", None)
    assert asked.body is not None
    log.append(factory().envelope("wf", None, asked.body))
    line = carry_cancel(ledger_over(log, tools=[tool]), "wf", "incident", by="ops")
    assert line == "wf: cancelled", line
    state = replay("wf", log.workflow_events("wf"))
    assert state.status is RunStatus.CANCELLED and calls[-1].startswith("undo:")
    assert [(c.attempt, c.operator) for c in claims(log)] == [(2, "ops")]


def test_a_restart_of_a_workflow_at_its_limit_is_carried_through() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    tool = book(calls)
    at_its_limit(log, tool)
    plan = restart.plan(replay("wf", log.workflow_events("wf")), "hotel", "wf.r1")
    line = carry_restart(ledger_over(log, tools=[tool]), plan, "fixed", by="ops")
    assert line == "wf: restarted as wf.r1 from hotel"
    assert replay("wf", log.workflow_events("wf")).status is RunStatus.RESTARTED


def test_an_operators_claim_spends_none_of_the_runners_attempts() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    tool = book(calls)
    ledger_over(log, tools=[tool]).workflow("wf", max_attempts=2).step("hotel", tool, hotel="A")
    operator_open(ledger_over(log, tools=[tool]), "wf", "look", "ops")
    state = replay("wf", log.workflow_events("wf"))
    assert (state.attempt, state.max_attempts) == (2, 3)
    # The runner's own second attempt is still its to take.
    again = ledger_over(log, tools=[tool]).workflow("wf", max_attempts=2)
    assert again.state.status is RunStatus.RUNNING and again.epoch == 3
    assert [c.operator for c in claims(log)] == ["ops", None]

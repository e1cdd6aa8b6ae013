"""A fleet's model budget: the budget topic's order decides each turn's reservation.

The fold is pure (every reader decides every reservation alike); runners in one process, or
in two ledgers over one budget log, racing for the last tokens cross the budget by at most
one turn's overrun beyond its estimate per concurrent runner, and never without overruns.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.fleetbudget import FleetBudget, FleetSpend
from stepledger.domain.usage import TurnUsage
from stepledger.errors import BudgetExceededError, DurabilityError
from stepledger.integrations import Spending
from stepledger.integrations._core import agent_steps
from stepledger.log import InMemoryEventLog
from stepledger.producer.fleetbudget import InMemoryBudgetLog
from stepledger.producer.ledger import Ledger
from stepledger.testing import ledger_over
from tests.unit.factories import factory

BUDGET = FleetBudget(tokens=1_000, per_turn_tokens=300)


def _reserved(eid: str, tokens: int = 300, limit: int | None = 1_000, fleet: str = "f") -> Any:
    body = ev.BudgetReserved(tokens=tokens, cost=0.0, limit_tokens=limit)
    event = factory().envelope("wf", "model#1", body, eid)
    return event.model_copy(update={"event_id": eid, "fleet_id": fleet})


def _body(body: Any, fleet: str = "f") -> Any:
    return factory().envelope("wf", None, body).model_copy(update={"fleet_id": fleet})


def test_reservations_are_granted_while_their_estimate_fits_in_log_order() -> None:
    spend = FleetSpend("f")
    spend.apply_all([_reserved(f"r{n}") for n in range(4)])
    assert [spend.decision(f"r{n}") for n in range(4)] == [True, True, True, False]
    assert spend.tokens == 900  # a refused reservation commits nothing


def test_a_settlement_replaces_the_estimate_and_frees_what_was_not_spent() -> None:
    spend = FleetSpend("f")
    spend.apply_all([_reserved("r0"), _reserved("r1"), _reserved("r2")])
    spend.apply(_body(ev.BudgetSettled(reservation="r0", tokens=100, cost=0.0)))
    spend.apply(_body(ev.BudgetSettled(reservation="r0", tokens=100, cost=0.0)))  # duplicate
    spend.apply(_reserved("r3"))
    assert spend.tokens == 1_000 and spend.decision("r3") is True


def test_a_raise_in_the_log_lifts_every_later_reservations_limit() -> None:
    spend = FleetSpend("f")
    spend.apply_all([_reserved("r0"), _reserved("r1"), _reserved("r2"), _reserved("r3")])
    spend.apply(_body(ev.BudgetRaised(tokens=300, by="ana")))
    spend.apply(_reserved("r4"))
    assert spend.decision("r3") is False and spend.decision("r4") is True


def test_another_fleets_records_and_duplicates_decide_nothing() -> None:
    spend = FleetSpend("f")
    spend.apply_all([_reserved("x", fleet="g"), _reserved("r0"), _reserved("r0")])
    assert spend.decision("x") is None and spend.tokens == 300


def _ledger(log: InMemoryEventLog, budgets: InMemoryBudgetLog, name: str) -> Ledger:
    ledger = ledger_over(log, fleet_id="f", producer_id=name)
    ledger._budget_log = budgets  # the two "processes" share one budget topic
    return ledger


def _race(ledgers: list[Ledger], runners: int, spent: int) -> tuple[list[int], int]:
    """Runners (threads over the ledgers) ask turns of ``spent`` tokens until refused."""
    asked: list[int] = []
    refused = 0
    lock = threading.Lock()
    spending = Spending(fleet_budget=BUDGET)
    start = threading.Barrier(runners)

    def run(n: int) -> None:
        nonlocal refused
        wf = ledgers[n % len(ledgers)].workflow(f"wf-{n}")
        steps = agent_steps(wf, spending=spending)
        start.wait(5)
        for turn in range(20):

            def ask(turn: int = turn) -> tuple[Any, TurnUsage]:
                with lock:
                    asked.append(spent)
                return {"text": f"{n}/{turn}"}, TurnUsage(input_tokens=spent)

            try:
                steps.model_turn_sync({"n": n, "turn": turn}, ask)
            except BudgetExceededError:
                with lock:
                    refused += 1
                return

    threads = [threading.Thread(target=run, args=(n,)) for n in range(runners)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return asked, refused


def test_runners_of_two_processes_racing_never_cross_when_no_turn_overruns() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    ledgers = [_ledger(log, budgets, "p1"), _ledger(log, budgets, "p2")]
    asked, refused = _race(ledgers, runners=4, spent=250)
    assert refused == 4
    assert sum(asked) <= 1_000 and sum(asked) + 300 > 1_000  # the last tokens were raced for


def test_racing_runners_cross_by_at_most_one_overrun_each() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    ledgers = [_ledger(log, budgets, "p1"), _ledger(log, budgets, "p2")]
    asked, refused = _race(ledgers, runners=4, spent=400)  # 100 past each estimate
    assert refused == 4
    assert sum(asked) <= 1_000 + 4 * (400 - 300)


def test_a_recorded_turn_replays_without_a_reservation() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    spending = Spending(fleet_budget=BUDGET)
    wf = _ledger(log, budgets, "p1").workflow("wf-r")
    answer = ({"text": "hi"}, TurnUsage(input_tokens=250))
    agent_steps(wf, spending=spending).model_turn_sync({"q": 1}, lambda: answer)
    again = _ledger(log, budgets, "p2").workflow("wf-r")
    turn = agent_steps(again, spending=spending).model_turn_sync({"q": 1}, pytest.fail)
    assert turn.reused
    kinds = [e.type for e in budgets.events]
    assert kinds == ["budget_reserved", "budget_settled"]


def test_an_unreachable_budget_topic_refuses_the_call() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    budgets.fail = True
    wf = _ledger(log, budgets, "p1").workflow("wf-u")
    steps = agent_steps(wf, spending=Spending(fleet_budget=BUDGET))
    with pytest.raises(DurabilityError):
        steps.model_turn_sync({"q": 1}, pytest.fail)


def _spent_out(budgets: InMemoryBudgetLog, log: InMemoryEventLog, budget: FleetBudget) -> Any:
    """A runner whose fleet spent its budget: its next turn is refused (or waits)."""
    steps = agent_steps(
        _ledger(log, budgets, "p1").workflow("wf-w"), spending=Spending(fleet_budget=budget)
    )
    for n in range(3):
        steps.model_turn_sync({"n": n}, lambda: ({"t": 1}, TurnUsage(input_tokens=300)))
    return steps


def test_a_refused_turn_waits_for_a_persons_raise_and_goes_on() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    steps = _spent_out(budgets, log, BUDGET.model_copy(update={"wait_s": 10.0}))
    done: list[Any] = []
    waiting = threading.Thread(
        target=lambda: done.append(
            steps.model_turn_sync({"n": 3}, lambda: ({"t": 2}, TurnUsage(input_tokens=300)))
        )
    )
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not done  # refused, waiting for a person
    raised = factory().envelope("f", None, ev.BudgetRaised(tokens=500, by="ana"), "r")
    budgets.append(raised.model_copy(update={"fleet_id": "f"}))
    waiting.join(10)
    assert done and done[0].response == {"t": 2}


def test_a_refused_turn_with_no_raise_in_time_is_refused() -> None:
    log, budgets = InMemoryEventLog(), InMemoryBudgetLog()
    steps = _spent_out(budgets, log, BUDGET.model_copy(update={"wait_s": 0.3}))
    with pytest.raises(BudgetExceededError, match=r"budget raise --fleet f"):
        steps.model_turn_sync({"n": 3}, pytest.fail)

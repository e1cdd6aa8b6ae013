"""A step is the logical call (in memory): occurrence, fingerprint, identity arguments.

What the three framework integrations share (``AgentSteps``): the n-th call of an effectful
tool in a run is the n-th recorded step of that tool whatever its wording; the workflow
checks by the call's fingerprint that it is the recorded call.  The same runs with each
framework's own offline model are in ``tests/integration/test_framework_identity.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

import stepledger as sl
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.integrations._core import AgentSteps, ToolFailure, request_digest
from stepledger.testing import InMemoryEventLog, ledger_over

KEY = "operator-secret-0123456789"


class Payments:
    """A payments service that counts its charges by key (a repeat under a key is one)."""

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, Any]] = {}
        self.calls = 0

    def tool(self, **spec: Any) -> sl.Tool:
        def charge(args: dict[str, Any], key: str) -> dict[str, Any]:
            self.calls += 1
            return self.charges.setdefault(key, dict(args))

        return sl.Tool(name="charge", keyed=True, run=charge, **spec)


def run_agent(log: InMemoryEventLog, tool: sl.Tool, *calls: dict[str, Any]) -> AgentSteps:
    """One run of an agent that makes these calls of ``tool``, in order."""
    steps = AgentSteps(ledger_over(log, redaction_key=KEY).workflow("w"))
    for arguments in calls:
        steps.call_sync(tool, arguments)
    return steps


def test_a_reworded_memo_is_the_recorded_call_and_charges_once() -> None:
    log, payments = InMemoryEventLog(), Payments()
    tool = payments.tool(identity_args=frozenset({"amount", "card"}))
    run_agent(log, tool, {"amount": 100, "card": "A", "memo": "rent"})
    again = run_agent(log, tool, {"amount": 100, "card": "A", "memo": "Rent for May, thanks"})
    assert [s.step_id for s in again.workflow.state.ordered_steps()] == ["charge#1"]
    assert payments.calls == 1 and len(payments.charges) == 1


def test_by_default_every_argument_identifies_the_call() -> None:
    log, payments = InMemoryEventLog(), Payments()
    run_agent(log, payments.tool(), {"amount": 100, "memo": "rent"})
    with pytest.raises(sl.PlanMismatchError) as refused:
        run_agent(log, payments.tool(), {"amount": 100, "memo": "Rent for May"})
    assert '"memo":"rent"' in str(refused.value) and '"memo":"Rent for May"' in str(refused.value)
    assert payments.calls == 1


def test_another_amount_stops_the_run_naming_both_calls() -> None:
    log, payments = InMemoryEventLog(), Payments()
    tool = payments.tool(identity_args=frozenset({"amount"}))
    run_agent(log, tool, {"amount": 100, "memo": "rent"})
    with pytest.raises(sl.PlanMismatchError) as refused:
        run_agent(log, tool, {"amount": 200, "memo": "rent"})
    message = str(refused.value)
    assert "'charge#1'" in message and '"amount":100' in message and '"amount":200' in message
    assert "\n" not in message and refused.value.step_id == "charge#1"
    assert payments.calls == 1


def test_another_card_is_another_call_with_a_redaction_key() -> None:
    log, payments = InMemoryEventLog(), Payments()
    tool = payments.tool(secret_args=frozenset({"card"}), policy=sl.ResolutionPolicy.ESCALATE)
    run_agent(log, tool, {"amount": 100, "card": "4111111111111111"})
    with pytest.raises(sl.PlanMismatchError, match="recorded as another call") as refused:
        run_agent(log, tool, {"amount": 100, "card": "5500000000000004"})
    assert "4111" not in str(refused.value) and "5500" not in str(refused.value)
    assert payments.calls == 1


def test_a_tool_called_twice_is_two_steps_and_a_resume_replays_both() -> None:
    log, payments = InMemoryEventLog(), Payments()
    tool = payments.tool(identity_args=frozenset({"amount"}))
    twice = ({"amount": 100, "memo": "first"}, {"amount": 100, "memo": "second"})
    run_agent(log, tool, *twice)
    again = run_agent(log, tool, {"amount": 100, "memo": "1st"}, {"amount": 100, "memo": "2nd"})
    assert [s.step_id for s in again.workflow.state.ordered_steps()] == ["charge#1", "charge#2"]
    assert payments.calls == 2 and len(payments.charges) == 2
    third = run_agent(log, tool, *twice, {"amount": 50, "memo": "a third, new"})
    assert [s.step_id for s in third.workflow.state.ordered_steps()][-1] == "charge#3"
    assert payments.calls == 3


def test_an_intent_recorded_before_fingerprints_still_resumes() -> None:
    log, payments = InMemoryEventLog(), Payments()
    tool = payments.tool()
    args = {"amount": 100, "memo": "rent"}
    ledger_over(log).workflow("w")  # started
    old = EventFactory("test", "old")
    intent = old.intent("w", "charge#1", tool, args, sequence=0)
    body = intent.body
    assert isinstance(body, ev.StepIntended)
    legacy = body.model_copy(update={"arguments_digest": tool.legacy_digest(args)})
    log.append(intent.model_copy(update={"body": legacy}))
    done = OutcomeStatus.SUCCEEDED
    log.append(old.outcome("w", "charge#1", attempt=1, status=done, result={"paid": 100}))
    steps = AgentSteps(ledger_over(log).workflow("w"))
    assert steps.call_sync(tool, args) == {"paid": 100}, "replayed, not a mismatch"
    with pytest.raises(sl.PlanMismatchError):
        AgentSteps(ledger_over(log).workflow("w")).call_sync(tool, {**args, "amount": 1})
    assert payments.calls == 0


def test_identity_arguments_are_top_level_names() -> None:
    with pytest.raises(sl.ToolDefinitionError, match=r"identity_args 'payment\.card'"):
        sl.Tool(name="t", keyed=True, identity_args=frozenset({"payment.card"}))


def test_a_request_digest_is_the_canonical_digest_of_what_was_said() -> None:
    said = [{"role": "user", "content": "book", "id": "run-1"}]
    assert request_digest(said) == request_digest([{"role": "user", "content": "book"}])
    assert request_digest(said) != request_digest([{"role": "user", "content": "Book"}])


def test_a_recorded_failure_is_told_only_to_the_call_that_failed() -> None:
    log, payments = InMemoryEventLog(), Payments()

    def decline(args: dict[str, Any], key: str) -> Any:
        raise ValueError("card declined")

    steps = AgentSteps(ledger_over(log).workflow("w"))
    with pytest.raises(ToolFailure):
        steps.call_sync(sl.Tool(name="charge", keyed=True, run=decline), {"amount": 100})
    resumed = AgentSteps(ledger_over(log).workflow("w"))
    with pytest.raises(ToolFailure, match="card declined"):
        resumed.call_sync(payments.tool(), {"amount": 100})  # told again, not charged
    with pytest.raises(sl.PlanMismatchError, match='"amount":200'):
        AgentSteps(ledger_over(log).workflow("w")).call_sync(payments.tool(), {"amount": 200})
    assert payments.calls == 0

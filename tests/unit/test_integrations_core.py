"""The pieces the framework integrations share: step ids, request digests, call order."""

from __future__ import annotations

import pytest

import stepledger as sl
from stepledger.integrations._core import AgentSteps, request_digest, to_json_text
from stepledger.integrations._turnstile import Turnstile
from stepledger.testing import InMemoryEventLog, ledger_over


@sl.tool(read_only=True)
def lookup(city: str) -> str:
    return city


def test_step_ids_follow_tool_and_arguments_not_order() -> None:
    log = InMemoryEventLog()
    wf = ledger_over(log).workflow("w")
    steps = AgentSteps(wf)
    for city in ("Paris", "Rome"):
        wf.step(steps.step_id(lookup, {"city": city}), lookup, city=city)
    again = AgentSteps(ledger_over(log).workflow("w"))
    # Asked in another order, each call finds its own recorded step; a new one comes after.
    assert again.step_id(lookup, {"city": "Rome"}) == "lookup#2"
    assert again.step_id(lookup, {"city": "Paris"}) == "lookup#1"
    assert again.step_id(lookup, {"city": "Paris"}) == "lookup#3", "asked twice: a new step"


def test_a_request_digest_ignores_what_a_framework_makes_up_per_run() -> None:
    one = {"input": [{"id": "fc_1", "call_id": "c", "output": "x", "timestamp": "t1"}]}
    two = {"input": [{"id": "fc_2", "call_id": "c", "output": "x", "timestamp": "t2"}]}
    assert request_digest(one) == request_digest(two)
    assert request_digest(one) != request_digest({"input": [{"call_id": "c", "output": "y"}]})


def test_results_reach_a_model_as_canonical_json() -> None:
    assert to_json_text({"b": 1, "a": [True, None]}) == '{"a": [true, null], "b": 1}'
    assert to_json_text("plain") == "plain"


def test_the_turnstile_passes_a_turns_calls_in_order_and_waits_for_none() -> None:
    gate = Turnstile()
    gate.expect(["held-back", "b", "c"])
    # "held-back" never arrives (the framework passed it over): nothing waits for it, and
    # no clock decides when to stop waiting.
    gate.enter("b")
    gate.leave("b")
    gate.enter("not-listed")  # not a call of this turn (a plain tool)
    gate.enter("c")
    gate.leave("c")


def test_the_turnstile_refuses_a_call_a_framework_runs_concurrently() -> None:
    gate = Turnstile()
    gate.expect(["a", "b"])
    gate.enter("a")
    with pytest.raises(sl.ToolDefinitionError, match="runs a turn's tool calls concurrently"):
        gate.enter("b")  # while "a" runs
    gate.leave("a")
    gate.enter("b")
    gate.leave("b")
    gate.expect(["a", "b"])  # the next turn
    gate.enter("b")
    gate.leave("b")
    with pytest.raises(sl.ToolDefinitionError, match="arrived after call 'b'"):
        gate.enter("a")  # after a later call of its turn


def test_a_tool_may_not_take_the_model_steps_name() -> None:
    steps = AgentSteps(ledger_over(InMemoryEventLog()).workflow("w"))
    with pytest.raises(sl.ToolDefinitionError, match="model turns"):
        steps.know([sl.Tool(name="model", read_only=True)])

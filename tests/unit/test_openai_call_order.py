"""The OpenAI Agents SDK runs a turn's tool calls as steps in the model's order, with no clock.

By default the SDK starts every function tool call of a turn at once, and only it knows which
of them it holds back (a guardrail's rejection, its own approval).  Ordering them by waiting a
while for each to arrive made the order of steps the scheduler's: a call slower to reach its
tool than the wait (a guardrail asking a moderation service, a loaded machine) was overtaken.
The integration has the SDK start each call once the one before it finished, so the order is
the model's whatever each call takes.  In memory: the SDK is real, the log is not.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    RunConfig,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    Usage,
    set_tracing_disabled,
    tool_input_guardrail,
)
from agents.run_config import ToolExecutionConfig
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import stepledger as sl
from stepledger.integrations import openai_agents as sla
from stepledger.testing import InMemoryEventLog, ledger_over

SLOW_S = 2.5
"""A guardrail this slow outlasts the 2 s the turnstile once gave a call to arrive."""


class OneTurn(Model):
    """Asks for the given calls in one turn, then answers "done"."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.turns = 0
        self.outputs: list[str] = []

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.turns += 1
        items = input if isinstance(input, list) else []
        self.outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        if self.turns == 1:
            out: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call", call_id=f"c{n}", name="book", arguments=json.dumps(args)
                )
                for n, args in enumerate(self.calls)
            ]
            return ModelResponse(output=out, usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="m", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


@tool_input_guardrail
async def moderated(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
    """Slow for the "Slow" hotel (a moderation service), and it refuses "Blocked"."""
    hotel = json.loads(data.context.tool_arguments)["hotel_name"]
    if hotel == "Slow":
        await asyncio.sleep(SLOW_S)
    if hotel == "Blocked":
        return ToolGuardrailFunctionOutput.reject_content("not this one")
    return ToolGuardrailFunctionOutput.allow()


def booked_in_order(calls: list[dict[str, Any]], **run: Any) -> tuple[list[str], OneTurn]:
    """Run one turn of ``calls`` to the guarded book tool; the hotels in the order booked."""
    booked: list[str] = []

    @sl.tool(keyed=True)
    async def book(hotel_name: str, nights: int, *, idempotency_key: str) -> dict[str, Any]:
        """Book a hotel room."""
        booked.append(hotel_name)
        return {"hotel": hotel_name}

    set_tracing_disabled(True)
    guarded = sla.function_tool(book)
    guarded.tool_input_guardrails = [moderated]
    model = OneTurn(calls)
    agent = Agent(name="trip", model=sla.RecordedModel(model), tools=[guarded])
    wf = ledger_over(InMemoryEventLog(), tools=[book]).workflow("trip")
    result = asyncio.run(asyncio.wait_for(sla.run(agent, "go", wf, **run), 60))
    assert result.final_output == "done"
    steps = [
        json.loads(s.arguments_json or "{}")["hotel_name"]
        for s in wf.state.ordered_steps()
        if s.tool == "book"
    ]
    assert steps == booked, "the steps' order is the order of the effects"
    return booked, model


def test_a_call_slow_to_reach_its_tool_is_not_overtaken_by_the_next() -> None:
    slow, fast = {"hotel_name": "Slow", "nights": 1}, {"hotel_name": "Fast", "nights": 1}
    booked, _ = booked_in_order([slow, fast])
    assert booked == ["Slow", "Fast"], "the model's order, however long the first call took"


def test_a_call_the_sdk_holds_back_is_not_waited_for_and_takes_no_step() -> None:
    blocked, ritz = {"hotel_name": "Blocked", "nights": 1}, {"hotel_name": "Ritz", "nights": 2}
    booked, model = booked_in_order([blocked, ritz])
    assert booked == ["Ritz"]
    assert model.outputs[0] == "not this one", "the model was told of the refusal"


def test_a_run_config_that_runs_a_turns_calls_at_once_is_refused_before_the_run() -> None:
    config = RunConfig(tool_execution=ToolExecutionConfig(max_function_tool_concurrency=4))
    with pytest.raises(sl.ToolDefinitionError, match="one at a time, in the model's order"):
        booked_in_order([{"hotel_name": "Ritz", "nights": 2}], run_config=config)


def test_the_run_config_given_is_kept_with_calls_one_at_a_time() -> None:
    from stepledger.integrations.openai_agents import _in_order

    given = RunConfig(
        workflow_name="trips",
        tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True),
    )
    kept = _in_order(given)
    assert isinstance(kept, RunConfig) and kept.workflow_name == "trips"
    assert (
        kept.tool_execution is not None and kept.tool_execution.pre_approval_tool_input_guardrails
    )
    assert kept.tool_execution.max_function_tool_concurrency == 1
    # None and dicts stay dicts: the runner then still owns (and closes) its model provider.
    plain: dict[str, Any] | None
    for plain in (None, {"workflow_name": "trips"}, {"tool_execution": {}}):
        made = _in_order(plain)
        assert isinstance(made, dict) and "model_provider" not in made
        assert made["tool_execution"].max_function_tool_concurrency == 1

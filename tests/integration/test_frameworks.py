"""The framework integrations' traps, on a real broker: each framework's own offline model.

What breaks when a framework meets the ledger by hand: a model's call ids as step ids (every
resume refused), an error of the ledger turned into model text or wrapped in the framework's
own error, ``idempotency_key`` in the model's schema, results as Python repr, a resume from a
rebuilt conversation refused at the first new step, parallel calls in any order.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, Model, ModelResponse, Usage, set_tracing_disabled
from agents.exceptions import UserError
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import stepledger as sl
from stepledger.config import Settings
from stepledger.domain.ids import idempotency_key
from stepledger.integrations import langgraph as sll
from stepledger.integrations import openai_agents as sla
from stepledger.integrations import pydantic_ai as slp
from stepledger.producer import approval
from tests.e2e.recovery_helpers import read_events

Plan = list[list[tuple[str, dict[str, Any]]]]
WEATHER: list[str] = []


class Hotel:
    """A stand-in booking service that counts its effects by key."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []
        self.booked: dict[str, dict[str, Any]] = {}
        self.sent: list[str] = []


@pytest.fixture
def hotel() -> Hotel:
    return Hotel()


@pytest.fixture
def tools(hotel: Hotel) -> dict[str, sl.Tool]:
    @sl.tool(read_only=True)
    def lookup(city: str) -> dict[str, Any]:
        """Find a hotel in a city."""
        hotel.looked_up.append(city)
        return {"city": city, "hotel": "Ritz"}

    @sl.tool(keyed=True, compensate=lambda args, key, result: hotel.booked.pop(key, None))
    async def book(hotel_name: str, nights: int, *, idempotency_key: str) -> dict[str, Any]:
        """Book a hotel room."""
        await asyncio.sleep(0.2 if hotel_name == "Slow" else 0)
        return hotel.booked.setdefault(idempotency_key, {"hotel": hotel_name, "nights": nights})

    @sl.tool(requires_approval=True)
    def notify(to: str) -> str:
        """Tell the customer (needs a human's approval)."""
        hotel.sent.append(to)
        return "sent"

    return {"lookup": lookup, "book": book, "notify": notify}


@pytest.fixture
def ledger(settings: Settings, tools: dict[str, sl.Tool]) -> Iterator[sl.Ledger]:
    options = sl.ResumeOptions(grace_s=0.0, approval_wait_s=0.2)
    with sl.Ledger(settings, tools=list(tools.values()), options=options) as opened:
        yield opened


def reopen(settings: Settings, tools: dict[str, sl.Tool]) -> sl.Ledger:
    """A new ledger on the same topic: "another process"."""
    return sl.Ledger(settings, tools=list(tools.values()), options=sl.ResumeOptions(grace_s=0.0))


# -- the OpenAI Agents SDK --------------------------------------------------------------------


class ScriptedModel(Model):
    """Each turn asks for the next calls of the plan (fresh call ids), then answers."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.turns: list[int] = []
        self.outputs: list[str] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *a: Any, **k: Any
    ) -> ModelResponse:
        items = input if isinstance(input, list) else []
        outputs = [_get(i, "output") for i in items if _get(i, "type") == "function_call_output"]
        self.outputs = [str(o) for o in outputs]
        # This model ignores results it was shown from the log: it asks for them again.
        turn = _turn_after(self.plan, len(outputs) - _from_log(items))
        self.turns.append(turn)
        if turn < len(self.plan):
            calls = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"call_{uuid.uuid4().hex}",
                    id=f"fc_{uuid.uuid4().hex}",
                    name=name,
                    arguments=json.dumps(args),
                )
                for name, args in self.plan[turn]
            ]
            return ModelResponse(output=list(calls), usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg_1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def _get(item: Any, name: str, default: Any = None) -> Any:
    value = item.get(name) if isinstance(item, dict) else getattr(item, name, None)
    return default if value is None else value


def _from_log(items: list[Any]) -> int:
    """Results the conversation was given from the log (``history_from_log``)."""
    return sum(
        1
        for i in items
        if _get(i, "type") == "function_call_output" and _get(i, "call_id", "").startswith("sl-")
    )


def _turn_after(plan: Plan, results: int) -> int:
    """The plan's turn once ``results`` tool results came back."""
    seen = 0
    for turn, calls in enumerate(plan):
        if seen >= results:
            return turn
        seen += len(calls)
    return len(plan)


def oa_agent(model: Model, tools: dict[str, sl.Tool]) -> Agent[Any]:
    set_tracing_disabled(True)
    return Agent(name="trip", model=model, tools=[sla.function_tool(t) for t in tools.values()])


def test_openai_tools_show_no_key_and_give_the_model_json(
    ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    schema = sla.function_tool(tools["book"]).params_json_schema
    assert set(schema["properties"]) == {"hotel_name", "nights"}
    assert "idempotency_key" not in json.dumps(schema)
    model = ScriptedModel([[("book", {"hotel_name": "Ritz", "nights": 2})]])
    wf = ledger.workflow(f"oa-json-{uuid.uuid4().hex[:6]}")
    result = asyncio.run(sla.run(oa_agent(sla.RecordedModel(model), tools), "go", wf))
    assert result.final_output == "done"
    assert json.loads(model.outputs[0]) == {"hotel": "Ritz", "nights": 2}, "JSON, not repr"
    key = idempotency_key(wf.workflow_id, "book#1", "book")
    assert list(hotel.booked) == [key], "the key came from the step, not from the model"


def test_openai_call_ids_never_name_steps_and_a_resume_asks_the_model_nothing(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    plan: Plan = [[("lookup", {"city": "Paris"})], [("book", {"hotel_name": "Ritz", "nights": 2})]]
    workflow_id = f"oa-ids-{uuid.uuid4().hex[:6]}"
    first = ScriptedModel(plan)
    asyncio.run(
        sla.run(oa_agent(sla.RecordedModel(first), tools), "go", ledger.workflow(workflow_id))
    )
    with reopen(settings, tools) as again:
        wf = again.workflow(workflow_id)
        second = ScriptedModel(plan)  # its call ids differ from the first run's
        result = asyncio.run(sla.run(oa_agent(sla.RecordedModel(second), tools), "go", wf))
    assert result.final_output == "done"
    assert second.turns == [], "every turn was replayed from the log"
    ids = [s.step_id for s in wf.state.ordered_steps()]
    assert ids == ["model#1", "lookup#1", "model#2", "book#1", "model#3"]
    assert len(hotel.booked) == 1 and hotel.looked_up == ["Paris"], "nothing ran twice"


def test_openai_ledger_errors_leave_the_run_unwrapped_with_default_error_handling(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    plan: Plan = [[("notify", {"to": "ana@example.test"})]]
    workflow_id = f"oa-err-{uuid.uuid4().hex[:6]}"
    model = ScriptedModel(plan)
    agent = oa_agent(sla.RecordedModel(model), tools)  # failure_error_function: the default
    with pytest.raises(sl.ApprovalPendingError) as caught:
        asyncio.run(sla.run(agent, "go", ledger.workflow(workflow_id)))
    assert not isinstance(caught.value, UserError)
    assert caught.value.step_id == "notify#1" and model.turns == [0], "not turned into text"
    approval.decide(
        ledger.log, ledger.events, ledger.reader, workflow_id, "notify#1", granted=True, by="qa"
    )
    with reopen(settings, tools) as again:
        result = asyncio.run(sla.run(agent, "go", again.workflow(workflow_id)))
    assert result.final_output == "done" and hotel.sent == ["ana@example.test"]
    assert model.turns == [0, 1], "the recorded turn was not asked again"


def test_openai_parallel_calls_run_in_the_order_the_model_gave(
    ledger: sl.Ledger, tools: dict[str, sl.Tool]
) -> None:
    both = [
        ("book", {"hotel_name": "Slow", "nights": 1}),
        ("book", {"hotel_name": "Fast", "nights": 1}),
    ]
    from agents import ToolGuardrailFunctionOutput, ToolInputGuardrailData, tool_input_guardrail

    @tool_input_guardrail
    async def moderated(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        # Slower than the 2 s a call was once given to arrive before the next went ahead.
        if "Slow" in data.context.tool_arguments:
            await asyncio.sleep(2.5)
        return ToolGuardrailFunctionOutput.allow()

    wf = ledger.workflow(f"oa-par-{uuid.uuid4().hex[:6]}")
    agent = oa_agent(sla.RecordedModel(ScriptedModel([both])), tools)
    for made in agent.tools:
        if made.name == "book":
            cast(Any, made).tool_input_guardrails = [moderated]
    asyncio.run(asyncio.wait_for(sla.run(agent, "go", wf), 60))
    steps = [s for s in wf.state.ordered_steps() if s.tool == "book"]
    assert [json.loads(s.result_json or "{}")["hotel"] for s in steps] == ["Slow", "Fast"]
    assert steps[0].resolved_at is not None and steps[1].intended_at is not None
    assert steps[0].resolved_at <= steps[1].intended_at, "one at a time, the model's order"


def test_openai_bad_arguments_and_plain_tools_are_the_models_business(
    ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    from agents import function_tool as sdk_tool

    @sdk_tool
    def weather(city: str) -> str:
        """A plain SDK tool: not a step."""
        return "sunny"

    turn: list[tuple[str, dict[str, Any]]] = [
        ("weather", {"city": "Paris"}),
        ("book", {"hotel_name": "Ritz", "nights": "two"}),
        ("book", {"hotel_name": "Ritz", "nights": 2}),
    ]
    model = ScriptedModel([turn])
    agent = oa_agent(sla.RecordedModel(model), tools)
    agent.tools.append(weather)
    wf = ledger.workflow(f"oa-bad-{uuid.uuid4().hex[:6]}")
    result = asyncio.run(asyncio.wait_for(sla.run(agent, "go", wf), 60))
    assert result.final_output == "done"
    assert model.outputs[0] == "sunny" and "error" in model.outputs[1].lower()
    assert json.loads(model.outputs[2]) == {"hotel": "Ritz", "nights": 2}
    assert [s.step_id for s in wf.state.ordered_steps() if s.tool == "book"] == ["book#1"]
    assert len(hotel.booked) == 1


def test_openai_turns_with_secret_arguments_are_recorded_without_the_secret(
    settings: Settings, ledger: sl.Ledger
) -> None:
    @sl.tool(keyed=True, secret_args={"card"}, policy=sl.ResolutionPolicy.ESCALATE)
    def pay(amount: int, card: str, *, idempotency_key: str) -> dict[str, Any]:
        """Pay with a card."""
        return {"paid": amount}

    secret = "4111111111111111"
    model = ScriptedModel([[("pay", {"amount": 5, "card": secret})]])
    agent = oa_agent(sla.RecordedModel(model), {"pay": pay})
    wf = ledger.workflow(f"oa-secret-{uuid.uuid4().hex[:6]}")
    assert asyncio.run(sla.run(agent, "go", wf)).final_output == "done"
    # Turns are recorded (the card as a mark), so a resume need not ask the model again.
    assert [s.step_id for s in wf.state.ordered_steps()] == ["model#1", "pay#1", "model#2"]
    written = [
        e.model_dump_json() for e in read_events(settings) if e.workflow_id == wf.workflow_id
    ]
    assert written and not any(secret in text for text in written)


def test_openai_resume_from_the_log_continues_without_reissuing_steps(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    workflow_id = f"oa-ff-{uuid.uuid4().hex[:6]}"
    first = ScriptedModel([[("lookup", {"city": "Paris"})]])
    steps = sla.steps_for(ledger.workflow(workflow_id), record_model=False)
    asyncio.run(sla.run(oa_agent(first, tools), "go", steps))
    with reopen(settings, tools) as again:
        wf = again.workflow(workflow_id)
        history = sla.history_from_log(wf)
        assert [_get(i, "type") for i in history] == ["function_call", "function_call_output"]
        # The model, shown the log, asks the lookup again and then the booking.
        plan: Plan = [
            [("lookup", {"city": "Paris"})],
            [("book", {"hotel_name": "Ritz", "nights": 2})],
        ]
        model = ScriptedModel(plan)
        steps = sla.steps_for(wf, record_model=False)
        result = asyncio.run(sla.run(oa_agent(model, tools), [*history], steps))
    assert result.final_output == "done"
    assert hotel.looked_up == ["Paris"], "the recorded lookup was replayed, not re-run"
    assert len(hotel.booked) == 1
    assert [s.step_id for s in wf.state.ordered_steps()] == ["lookup#1", "book#1"]


def test_without_fast_forward_a_continued_plan_is_refused(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    """The trap the integrations close: a new step where the log recorded another."""
    workflow_id = f"ff-{uuid.uuid4().hex[:6]}"
    lookup = tools["lookup"]
    ledger.workflow(workflow_id).step("lookup#1", lookup, city="Paris")
    with reopen(settings, tools) as again, pytest.raises(sl.PlanMismatchError):
        again.workflow(workflow_id).step("lookup#2", lookup, city="Rome")
    with reopen(settings, tools) as again:
        wf = again.workflow(workflow_id)
        wf.fast_forward()
        assert wf.step("lookup#2", lookup, city="Rome")["city"] == "Rome"
        assert wf.step("lookup#1", lookup, city="Paris")["city"] == "Paris"
    assert hotel.looked_up == ["Paris", "Rome"], "the recorded step was replayed"


# -- Pydantic AI ------------------------------------------------------------------------------


def pai_agent(tools: dict[str, sl.Tool], plan: Plan, turns: list[int]) -> Any:
    from pydantic_ai import Agent as PaiAgent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        # This model ignores results it was shown from the log: it asks for them again.
        fresh = [r for r in results if not r.tool_call_id.startswith("sl-")]
        turn = _turn_after(plan, len(fresh))
        turns.append(turn)
        if turn < len(plan):
            parts = [ToolCallPart(n, a, tool_call_id=uuid.uuid4().hex) for n, a in plan[turn]]
            return ModelResponse(parts=list(parts))
        return ModelResponse(parts=[TextPart("done " + ";".join(str(r.content) for r in results))])

    from pydantic_ai.toolsets import FunctionToolset

    def weather(city: str) -> str:
        """A plain Pydantic AI tool: it runs as a read-only step."""
        WEATHER.append(city)
        return "sunny"

    return PaiAgent(
        FunctionModel(respond),
        name="trip",
        toolsets=[slp.toolset(tools.values()), FunctionToolset([weather], id="plain")],
        capabilities=[slp.StepLedgerDurability()],
    )


def test_pydantic_ai_steps_keys_and_replay(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    schema = slp.toolset([tools["book"]]).tools["book"].tool_def.parameters_json_schema
    assert "idempotency_key" not in json.dumps(schema)
    both = [
        ("book", {"hotel_name": "Slow", "nights": 1}),
        ("book", {"hotel_name": "Ritz", "nights": 2}),
    ]
    plan: Plan = [[("lookup", {"city": "Paris"}), ("weather", {"city": "Paris"})], both]
    workflow_id = f"pai-{uuid.uuid4().hex[:6]}"
    WEATHER.clear()
    turns: list[int] = []
    result = asyncio.run(slp.run(pai_agent(tools, plan, turns), "go", ledger.workflow(workflow_id)))
    assert turns == [0, 1, 2] and result.output.startswith("done")
    keys = [idempotency_key(workflow_id, f"book#{n}", "book") for n in (1, 2)]
    assert list(hotel.booked) == keys, "the keys came from the steps, in the model's order"
    with reopen(settings, tools) as again:
        wf = again.workflow(workflow_id)
        replayed: list[int] = []
        asyncio.run(slp.run(pai_agent(tools, plan, replayed), "go", wf))
    assert replayed == [], "no recorded model request was sent again"
    ids = [s.step_id for s in wf.state.ordered_steps()]
    assert ids == ["model#1", "lookup#1", "weather#1", "model#2", "book#1", "book#2", "model#3"]
    assert hotel.looked_up == ["Paris"] and len(hotel.booked) == 2 and WEATHER == ["Paris"]
    history = slp.history_from_log(wf)
    assert [m.kind for m in history] == ["response", "request"] * 4
    assert history[1].parts[0].content == {"city": "Paris", "hotel": "Ritz"}  # type: ignore[union-attr]


def test_pydantic_ai_and_langgraph_continue_from_the_log(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    lookup: Plan = [[("lookup", {"city": "Paris"})]]
    plan: Plan = [*lookup, [("book", {"hotel_name": "Ritz", "nights": 2})]]
    pai_id, lg_id = f"pai-ff-{uuid.uuid4().hex[:6]}", f"lg-ff-{uuid.uuid4().hex[:6]}"
    turns: list[int] = []
    quiet: dict[str, Any] = {"record_model": False}
    asyncio.run(
        slp.run(
            pai_agent(tools, lookup, turns), "go", slp.steps_for(ledger.workflow(pai_id), **quiet)
        )
    )
    sll.run(
        lg_graph(tools, lookup, turns),
        {"messages": [("user", "go")]},
        sll.steps_for(ledger.workflow(lg_id), **quiet),
    )
    assert hotel.looked_up == ["Paris", "Paris"]
    with reopen(settings, tools) as again:
        wf = again.workflow(pai_id)
        history = slp.history_from_log(wf)
        agent = pai_agent(tools, plan, turns)
        asyncio.run(slp.run(agent, "go on", slp.steps_for(wf, **quiet), message_history=history))
        graph_wf = again.workflow(lg_id)
        messages = [*sll.history_from_log(graph_wf), ("user", "go on")]
        sll.run(
            lg_graph(tools, plan, turns), {"messages": messages}, sll.steps_for(graph_wf, **quiet)
        )
    assert hotel.looked_up == ["Paris", "Paris"], "each recorded lookup was replayed"
    assert len(hotel.booked) == 2, "one booking per workflow: the new step was not refused"
    for state in (wf.state, graph_wf.state):
        assert [s.step_id for s in state.ordered_steps()] == ["lookup#1", "book#1"]


def test_pydantic_ai_ledger_errors_leave_the_run_as_they_are(
    ledger: sl.Ledger, tools: dict[str, sl.Tool]
) -> None:
    turns: list[int] = []
    agent = pai_agent(tools, [[("notify", {"to": "ana@example.test"})]], turns)
    with pytest.raises(sl.ApprovalPendingError):
        asyncio.run(slp.run(agent, "go", ledger.workflow(f"pai-e-{uuid.uuid4().hex[:6]}")))
    assert turns == [0], "the model was not told, nor asked again"


# -- LangGraph --------------------------------------------------------------------------------


def lg_graph(tools: dict[str, sl.Tool], plan: Plan, turns: list[int]) -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    class Scripted(FakeMessagesListChatModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            results = [m for m in messages if isinstance(m, ToolMessage)]
            fresh = [r for r in results if not r.tool_call_id.startswith("sl-")]
            turn = _turn_after(plan, len(fresh))
            turns.append(turn)
            if turn < len(plan):
                calls = [{"name": n, "args": a, "id": uuid.uuid4().hex} for n, a in plan[turn]]
                message = AIMessage(content="", tool_calls=calls)
            else:
                message = AIMessage(content="done " + ";".join(str(r.content) for r in results))
            return ChatResult(generations=[ChatGeneration(message=message)])

    graph = StateGraph(MessagesState)
    graph.add_node("model", sll.model_node(Scripted(responses=[])))
    graph.add_node("tools", sll.tool_node(tools.values()))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def test_langgraph_tool_node_steps_errors_and_history(
    settings: Settings, ledger: sl.Ledger, tools: dict[str, sl.Tool], hotel: Hotel
) -> None:
    both = [
        ("book", {"hotel_name": "Slow", "nights": 1}),
        ("book", {"hotel_name": "Fast", "nights": 1}),
    ]
    plan: Plan = [[("lookup", {"city": "Paris"})], both, [("notify", {"to": "ana"})]]
    workflow_id = f"lg-{uuid.uuid4().hex[:6]}"
    turns: list[int] = []
    with pytest.raises(sl.ApprovalPendingError):
        sll.run(
            lg_graph(tools, plan, turns),
            {"messages": [("user", "go")]},
            ledger.workflow(workflow_id),
        )
    assert turns == [0, 1, 2], "the pending approval did not become a ToolMessage"
    approval.decide(
        ledger.log, ledger.events, ledger.reader, workflow_id, "notify#1", granted=True, by="qa"
    )
    with reopen(settings, tools) as again:
        wf = again.workflow(workflow_id)
        state = sll.run(lg_graph(tools, plan, turns), {"messages": [("user", "go")]}, wf)
    assert state["messages"][-1].content.startswith("done")
    assert turns == [0, 1, 2, 3], "recorded turns replayed, only the last one asked"
    ids = [s.step_id for s in wf.state.ordered_steps() if s.tool != "model"]
    assert ids == ["lookup#1", "book#1", "book#2", "notify#1"], "the model's order"
    assert hotel.sent == ["ana"] and len(hotel.booked) == 2 and hotel.looked_up == ["Paris"]
    history = sll.history_from_log(wf)
    assert [m.type for m in history] == ["ai", "tool"] * 4
    assert set(sll.tools([tools["book"]])[0].args) == {"hotel_name", "nights"}
    assert json.loads(str(history[1].content)) == {"city": "Paris", "hotel": "Ritz"}


def test_each_framework_takes_at_most_fifteen_lines_in_the_docs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "frameworks.md").read_text()
    blocks = re.findall(r"<!-- framework: ([\w-]+) -->\n```python\n(.*?)\n```", text, re.S)
    assert {name for name, _ in blocks} == {"openai-agents", "pydantic-ai", "langgraph"}
    for name, code in blocks:
        lines = [line for line in code.splitlines() if line.strip()]
        assert len(lines) <= 15, (name, len(lines))

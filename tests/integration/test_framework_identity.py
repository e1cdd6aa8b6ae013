"""A step is the logical call, on a real broker, with each framework's own offline model.

A resumed agent whose model words a free-text argument differently (a memo) is making the
recorded call: it is replayed, never made twice.  Another amount is another call: the run
stops with PlanMismatchError naming both.  A model that legitimately calls a tool twice,
in one turn or in two, makes two steps.  A framework tool that is not a step is warned
about, and refused with ``strict=True``.  The crash variant (the charge in doubt, then a
re-worded resume) is ``tests/e2e/test_frameworks_crash.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Usage, set_tracing_disabled
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import stepledger as sl
from stepledger.config import Settings
from stepledger.errors import UnrecordedToolWarning
from stepledger.integrations import langgraph as sll
from stepledger.integrations import openai_agents as sla
from stepledger.integrations import pydantic_ai as slp

FRAMEWORKS = ["openai-agents", "pydantic-ai", "langgraph"]
Turns = list[list[tuple[str, dict[str, Any]]]]


@dataclass
class Bank:
    """A payments service that counts its charges by key, and an email it sends."""

    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: int = 0
    emails: list[str] = field(default_factory=list)

    def tools(self) -> list[sl.Tool]:
        @sl.tool(keyed=True, identity_args=frozenset({"amount"}))
        def pay(amount: int, memo: str, *, idempotency_key: str) -> dict[str, Any]:
            """Pay an amount; the memo is free text."""
            self.calls += 1
            return self.charges.setdefault(idempotency_key, {"paid": amount})

        return [pay]

    def email(self, to: str) -> str:
        """A plain framework tool: not a step."""
        self.emails.append(to)
        return "sent"


def said(turns: Turns, results: int) -> int:
    """The turn a scripted model is at once it has seen ``results`` tool results."""
    seen = 0
    for turn, calls in enumerate(turns):
        if seen >= results:
            return turn
        seen += len(calls)
    return len(turns)


# -- one agent per framework, each with its own offline model, scripted by turns -----------


class OpenAIScript(Model):
    def __init__(self, turns: Turns, asked: list[int]) -> None:
        self.turns, self.asked = turns, asked

    async def get_response(
        self, system_instructions: Any, input: Any, *a: Any, **k: Any
    ) -> ModelResponse:
        items = input if isinstance(input, list) else []
        done = [i for i in items if _get(i, "type") == "function_call_output"]
        turn = said(self.turns, len(done))
        self.asked.append(turn)
        if turn < len(self.turns):
            calls = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"call_{uuid.uuid4().hex}",
                    id=f"fc_{uuid.uuid4().hex}",
                    name=name,
                    arguments=json.dumps(args),
                )
                for name, args in self.turns[turn]
            ]
            return ModelResponse(output=list(calls), usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg_1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def run_openai(
    wf: sl.Workflow, bank: Bank, turns: Turns, prompt: str, plain: bool, strict: bool
) -> list[int]:
    from agents import function_tool as sdk_tool

    set_tracing_disabled(True)
    asked: list[int] = []
    tools: list[Any] = [sla.function_tool(t) for t in bank.tools()]
    if plain:
        tools.append(sdk_tool(bank.email))
    agent = Agent(name="pay", model=sla.RecordedModel(OpenAIScript(turns, asked)), tools=tools)
    asyncio.run(sla.run(agent, prompt, wf, strict=strict))
    return asked


def run_pydantic_ai(
    wf: sl.Workflow, bank: Bank, turns: Turns, prompt: str, plain: bool, strict: bool
) -> list[int]:
    from pydantic_ai import Agent as PaiAgent
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.messages import ModelResponse as PaiResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    asked: list[int] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
        done = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        turn = said(turns, len(done))
        asked.append(turn)
        if turn < len(turns):
            parts = [ToolCallPart(n, a, tool_call_id=uuid.uuid4().hex) for n, a in turns[turn]]
            return PaiResponse(parts=list(parts))
        return PaiResponse(parts=[TextPart("done")])

    toolsets: list[Any] = [slp.toolset(bank.tools())]
    if plain:
        toolsets.append(FunctionToolset([bank.email], id="plain"))
    agent = PaiAgent(
        FunctionModel(respond),
        name="pay",
        toolsets=toolsets,
        capabilities=[slp.StepLedgerDurability()],
    )
    asyncio.run(slp.run(agent, prompt, wf, strict=strict))
    return asked


def run_langgraph(
    wf: sl.Workflow, bank: Bank, turns: Turns, prompt: str, plain: bool, strict: bool
) -> list[int]:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    asked: list[int] = []

    class Scripted(FakeMessagesListChatModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            turn = said(turns, sum(isinstance(m, ToolMessage) for m in messages))
            asked.append(turn)
            if turn < len(turns):
                calls = [{"name": n, "args": a, "id": uuid.uuid4().hex} for n, a in turns[turn]]
                message = AIMessage(content="", tool_calls=calls)
            else:
                message = AIMessage(content="done")
            return ChatResult(generations=[ChatGeneration(message=message)])

    graph = StateGraph(MessagesState)
    graph.add_node("model", sll.model_node(Scripted(responses=[])))
    graph.add_node("tools", sll.tool_node(bank.tools()))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    if plain:
        graph.add_node("mail", ToolNode([lc_tool(bank.email)]))
    sll.run(graph.compile(), {"messages": [("user", prompt)]}, wf, strict=strict)
    return asked


Runner = Callable[[sl.Workflow, Bank, Turns, str, bool, bool], list[int]]
RUNNERS: dict[str, Runner] = {
    "openai-agents": run_openai,
    "pydantic-ai": run_pydantic_ai,
    "langgraph": run_langgraph,
}


@dataclass
class Agents:
    """One framework's agent over a fresh topic; each run is a new process's ledger."""

    framework: str
    settings: Settings
    bank: Bank = field(default_factory=Bank)
    workflow_id: str = field(default_factory=lambda: f"pay-{uuid.uuid4().hex[:8]}")

    def run(
        self, turns: Turns, prompt: str = "pay", *, plain: bool = False, strict: bool = False
    ) -> tuple[list[int], sl.Workflow]:
        options = sl.ResumeOptions(grace_s=0.0)
        with sl.Ledger(self.settings, tools=self.bank.tools(), options=options) as ledger:
            wf = ledger.workflow(self.workflow_id)
            asked = RUNNERS[self.framework](wf, self.bank, turns, prompt, plain, strict)
        return asked, wf


@pytest.fixture(params=FRAMEWORKS)
def agents(request: pytest.FixtureRequest, settings: Settings) -> Agents:
    return Agents(str(request.param), settings)


def pay(amount: int, memo: str) -> tuple[str, dict[str, Any]]:
    return ("pay", {"amount": amount, "memo": memo})


def tool_steps(wf: sl.Workflow) -> list[str]:
    return [s.step_id for s in wf.state.ordered_steps() if s.tool != "model"]


def test_a_resume_whose_model_rewords_the_memo_replays_the_charge(agents: Agents) -> None:
    agents.run([[pay(100, "rent")]])
    # The prompt carries the time: the recorded model turn does not match, the model is
    # asked again and words the memo its own way this time.
    asked, wf = agents.run([[pay(100, "Rent for May, thank you")]], "pay (it is 12:03)")
    assert asked == [0, 1], "the model was asked again"
    assert tool_steps(wf) == ["pay#1"], "the re-worded call is the recorded step"
    assert agents.bank.calls == 1 and len(agents.bank.charges) == 1, "charged once"


def test_another_amount_on_resume_stops_the_run_naming_both_calls(agents: Agents) -> None:
    agents.run([[pay(100, "rent")]])
    with pytest.raises(sl.PlanMismatchError) as refused:
        agents.run([[pay(200, "rent")]], "pay (it is 12:03)")
    message = str(refused.value)
    assert "'pay#1'" in message and '"amount":100' in message and '"amount":200' in message
    assert agents.bank.calls == 1


@pytest.mark.parametrize("shape", ["one turn", "two turns"])
def test_a_model_calling_the_tool_twice_makes_two_steps(agents: Agents, shape: str) -> None:
    calls = [pay(100, "first half"), pay(100, "second half")]
    turns: Turns = [calls] if shape == "one turn" else [[calls[0]], [calls[1]]]
    agents.run(turns)
    assert len(agents.bank.charges) == 2
    reworded = [[(n, {**a, "memo": a["memo"].upper()}) for n, a in t] for t in turns]
    _, wf = agents.run(reworded, "pay again")
    assert tool_steps(wf) == ["pay#1", "pay#2"]
    assert agents.bank.calls == 2 and len(agents.bank.charges) == 2, "each replayed, none anew"


def test_a_plain_framework_tool_is_warned_about_and_refused_when_strict(
    agents: Agents,
) -> None:
    with pytest.warns(UnrecordedToolWarning, match="'email'"):
        agents.run([[pay(100, "rent")]], plain=True)
    assert agents.bank.calls == 1
    agents.workflow_id = f"strict-{uuid.uuid4().hex[:8]}"
    with pytest.raises(sl.ToolDefinitionError, match="'email'") as refused:
        agents.run([[pay(100, "rent")]], plain=True, strict=True)
    assert "\n" not in str(refused.value)
    assert agents.bank.calls == 1, "refused before anything ran"

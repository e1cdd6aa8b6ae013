"""The token ledger on a real broker, with each framework's own offline model and usage.

A run crashes after two model turns and a tool call; the resume replays both turns: the
log says they were incurred once and reused once, and the sums are the scripted usage.
A prompt carrying the time replays its turn once the time is declared volatile.  A
workflow's model budget stops the call that would spend past it, as a stepledger error
that leaves the framework's run as itself.
"""

from __future__ import annotations

import asyncio
import json
import time
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
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import SecretStr

import stepledger as sl
from stepledger.config import Settings
from stepledger.domain.events import Event, ModelTurnReused, StepOutcome
from stepledger.domain.usage import TurnUsage
from stepledger.errors import BudgetExceededError
from stepledger.integrations import Budget, FleetBudget, Spending, Volatile
from stepledger.integrations import langgraph as sll
from stepledger.integrations import openai_agents as sla
from stepledger.integrations import pydantic_ai as slp
from stepledger.integrations._core import AgentSteps
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import ensure_budget_topic
from stepledger.log import codec_for
from stepledger.projector.costs import MODEL_CALL_COLUMNS
from stepledger.projector.fold import BatchFold
from stepledger.projector.projection import WorkflowProjection
from stepledger.testing import Crash
from tests.e2e.recovery_helpers import read_events

FRAMEWORKS = ["openai-agents", "pydantic-ai", "langgraph"]
MODEL = "scripted-1"
#: The turns: pay, then a lookup, then the answer.
PLAN: list[tuple[str, dict[str, Any]] | None] = [
    ("pay", {"amount": 100, "memo": "rent"}),
    ("track", {"ref": "r-1"}),
    None,
]


def usage(turn: int) -> TurnUsage:
    """The usage the scripted model reports for a turn."""
    n = turn + 1
    return TurnUsage(
        model=MODEL,
        input_tokens=100 * n,
        output_tokens=10 * n,
        cached_tokens=5 * n,
        reasoning_tokens=2 * n,
    )


CARD = "card-4242-SECRET-9817"
#: The plan of the secret test: the payment carries a card (a secret argument).
SECRET_PLAN: list[tuple[str, dict[str, Any]] | None] = [
    ("pay", {"amount": 100, "memo": "rent", "card": CARD}),
    ("track", {"ref": "r-1"}),
    None,
]


@dataclass
class Shop:
    """The tools: a keyed payment and a lookup that can crash the process once."""

    crash_lookup: bool = False
    paid: dict[str, int] = field(default_factory=dict)
    pay_calls: int = 0
    cards: list[str] = field(default_factory=list)

    def tools(self) -> list[sl.Tool]:
        # A secret argument cannot be re-driven by recovery (it has only the marks).
        @sl.tool(keyed=True, secret_args=frozenset({"card"}), policy="escalate")
        def pay(amount: int, memo: str, card: str = "", *, idempotency_key: str) -> dict[str, Any]:
            """Pay an amount (with a card, a secret)."""
            self.pay_calls += 1
            self.cards.append(card)
            return {"paid": self.paid.setdefault(idempotency_key, amount)}

        @sl.tool(read_only=True)
        def track(ref: str) -> dict[str, Any]:
            """Look a parcel up."""
            if self.crash_lookup:
                raise Crash("SIGKILL mid-lookup")
            return {"ref": ref, "where": "depot"}

        return [pay, track]


def turn_of(results: int) -> int:
    return min(results, len(PLAN) - 1)


def planned(turn: int) -> tuple[str, dict[str, Any]] | None:
    """The call a turn asks for (the secret test's plan while it runs)."""
    return (SECRET_PLAN if SECRET.on else PLAN)[turn]


class _Secret:
    on = False


SECRET = _Secret()


# -- each framework's offline model, reporting usage -------------------------------------------


class OpenAIScript(Model):
    def __init__(self, asked: list[int]) -> None:
        self.asked = asked
        self.model = MODEL

    async def get_response(
        self, system_instructions: Any, input: Any, *a: Any, **k: Any
    ) -> ModelResponse:
        items = input if isinstance(input, list) else []
        turn = turn_of(sum(1 for i in items if _get(i, "type") == "function_call_output"))
        self.asked.append(turn)
        u = usage(turn)
        sdk = Usage(
            requests=1,
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            total_tokens=u.tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=u.cached_tokens, cache_write_tokens=0
            ),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=u.reasoning_tokens),
        )
        step = planned(turn)
        if step is not None:
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{uuid.uuid4().hex}",
                id=f"fc_{uuid.uuid4().hex}",
                name=step[0],
                arguments=json.dumps(step[1]),
            )
            return ModelResponse(output=[call], usage=sdk, response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg_1", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=sdk, response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def run_openai(steps: Any, shop: Shop, prompt: str, asked: list[int]) -> Any:
    set_tracing_disabled(True)
    tools: list[Any] = [sla.function_tool(t) for t in shop.tools()]
    agent = Agent(name="shop", model=sla.RecordedModel(OpenAIScript(asked)), tools=tools)
    return asyncio.run(sla.run(agent, prompt, steps)).context_wrapper.usage


def run_pydantic_ai(steps: Any, shop: Shop, prompt: str, asked: list[int]) -> Any:
    from pydantic_ai import Agent as PaiAgent
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.messages import ModelResponse as PaiResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    def respond(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
        done = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        turn = turn_of(len(done))
        asked.append(turn)
        u = usage(turn)
        request_usage = RequestUsage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_tokens=u.cached_tokens,
            output_reasoning_tokens=u.reasoning_tokens,
        )
        step = planned(turn)
        parts: list[Any] = (
            [ToolCallPart(step[0], step[1], tool_call_id=uuid.uuid4().hex)]
            if step is not None
            else [TextPart("done")]
        )
        return PaiResponse(parts=parts, usage=request_usage, model_name=MODEL)

    agent = PaiAgent(
        FunctionModel(respond),
        name="shop",
        toolsets=[slp.toolset(shop.tools())],
        capabilities=[slp.StepLedgerDurability()],
    )
    return asyncio.run(slp.run(agent, prompt, steps)).usage()


def run_langgraph(steps: Any, shop: Shop, prompt: str, asked: list[int]) -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    class Scripted(FakeMessagesListChatModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            turn = turn_of(sum(isinstance(m, ToolMessage) for m in messages))
            asked.append(turn)
            u = usage(turn)
            metadata = {
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "total_tokens": u.tokens,
                "input_token_details": {"cache_read": u.cached_tokens},
                "output_token_details": {"reasoning": u.reasoning_tokens},
            }
            step = planned(turn)
            calls = [] if step is None else [{"name": step[0], "args": step[1], "id": "c1"}]
            message = AIMessage(
                content="" if calls else "done",
                tool_calls=calls,
                usage_metadata=metadata,
                response_metadata={"model_name": MODEL},
            )
            return ChatResult(generations=[ChatGeneration(message=message)])

    graph = StateGraph(MessagesState)
    graph.add_node("model", sll.model_node(Scripted(responses=[])))
    graph.add_node("tools", sll.tool_node(shop.tools()))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return sll.run(graph.compile(), {"messages": [("user", prompt)]}, steps)


Runner = Callable[[Any, Shop, str, list[int]], Any]
RUNNERS: dict[str, Runner] = {
    "openai-agents": run_openai,
    "pydantic-ai": run_pydantic_ai,
    "langgraph": run_langgraph,
}
STEPS_FOR = {
    "openai-agents": sla.steps_for,
    "pydantic-ai": slp.steps_for,
    "langgraph": sll.steps_for,
}


@dataclass
class Runs:
    """One framework's agent over a fresh topic; each run is a new process's ledger."""

    framework: str
    settings: Settings
    shop: Shop = field(default_factory=Shop)
    workflow_id: str = field(default_factory=lambda: f"shop-{uuid.uuid4().hex[:8]}")
    result: Any = None
    """What the last run's framework reported (its usage, or the graph's state)."""

    def run(
        self,
        prompt: str = "pay and track",
        spending: Spending | None = None,
        asked: list[int] | None = None,
    ) -> list[int]:
        asked = [] if asked is None else asked
        options = sl.ResumeOptions(grace_s=0.0)
        with sl.Ledger(self.settings, tools=self.shop.tools(), options=options) as ledger:
            wf = ledger.workflow(self.workflow_id)
            steps = STEPS_FOR[self.framework](wf, spending=spending)
            self.result = RUNNERS[self.framework](steps, self.shop, prompt, asked)
        return asked

    def crashing(self, **kwargs: Any) -> list[int]:
        """A run that dies inside the lookup (after two model turns and the payment)."""
        self.shop.crash_lookup = True
        asked: list[int] = []
        try:
            self.run(asked=asked, **kwargs)
        except Crash:
            pass
        else:
            pytest.fail("the run did not crash")
        finally:
            self.shop.crash_lookup = False
        return asked

    def model_calls(self) -> list[dict[str, Any]]:
        """The ``model_calls`` rows the projector folds from the workflow's log."""
        events = [e for e in read_events(self.settings) if e.workflow_id == self.workflow_id]
        return fold_model_calls(events)


def fold_model_calls(events: list[Event]) -> list[dict[str, Any]]:
    fold = BatchFold()
    projection = WorkflowProjection(events[0].workflow_id)
    for offset, event in enumerate(events):
        fold.add(projection, event, ("t", 0, offset), b"")
    columns = fold.tables()["model_calls"]
    rows = zip(*columns.values(), strict=True)
    return [dict(zip(MODEL_CALL_COLUMNS, row, strict=True)) for row in rows]


def read_topic_events(settings: Settings, topic: str) -> list[Event]:
    found = [r.event for r in read_topic(settings, codec_for(settings), topic=topic)]
    return [e for e in found if e is not None]


@pytest.fixture(params=FRAMEWORKS)
def runs(request: pytest.FixtureRequest, settings: Settings) -> Runs:
    return Runs(str(request.param), settings)


def test_a_crash_after_two_turns_and_a_tool_call_reuses_both_turns_once(runs: Runs) -> None:
    assert runs.crashing() == [0, 1]
    assert runs.run() == [2], "the two recorded turns were replayed, not asked again"
    assert runs.shop.pay_calls == 1
    if runs.framework != "langgraph":
        # The framework's run total is what the turns cost: a replayed turn reports the
        # usage it was recorded with (the OpenAI replay gave an empty Usage before).
        assert runs.result.input_tokens == sum(usage(t).input_tokens for t in (0, 1, 2))
        assert runs.result.output_tokens == sum(usage(t).output_tokens for t in (0, 1, 2))
    rows = runs.model_calls()
    incurred = sorted((r["step_id"], r["attempt"]) for r in rows if r["kind"] == "incurred")
    reused = sorted((r["step_id"], r["attempt"]) for r in rows if r["kind"] == "reused")
    assert incurred == [("model#1", 1), ("model#2", 1), ("model#3", 2)]
    assert reused == [("model#1", 2), ("model#2", 2)]
    for kind, turns in (("incurred", [0, 1, 2]), ("reused", [0, 1])):
        mine = [r for r in rows if r["kind"] == kind]
        for name in ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens"):
            expected = sum(getattr(usage(t), name) for t in turns)
            assert sum(r[name] for r in mine) == expected, (kind, name)
        # Pydantic AI names a FunctionModel after its function, whatever the response says.
        named = "function:respond:" if runs.framework == "pydantic-ai" else MODEL
        assert {r["model"] for r in mine} == {named}


def test_a_prompt_with_the_time_reuses_its_turn_once_the_time_is_volatile(runs: Runs) -> None:
    volatile = Spending(volatile=Volatile(patterns=(r"\(it is \d\d:\d\d:\d\d\.\d+\)",)))
    first = f"pay and track (it is {time.strftime('%H:%M:%S')}.1)"
    assert runs.crashing(prompt=first, spending=volatile) == [0, 1]
    again = f"pay and track (it is {time.strftime('%H:%M:%S')}.2)"
    assert runs.run(prompt=again, spending=volatile) == [2]
    reused = [r for r in runs.model_calls() if r["kind"] == "reused"]
    assert len(reused) == 2


def test_a_budget_stops_the_call_that_would_spend_past_it(runs: Runs) -> None:
    # Turn 0 spends 110 tokens, turn 1 220: a budget of 300 lets both run, not a third.
    tight = Spending(budget=Budget(tokens=300))
    with pytest.raises(BudgetExceededError) as raised:
        runs.run(spending=tight)
    assert raised.value.spent_tokens == 330 and raised.value.workflow_id == runs.workflow_id
    # A resume with the budget raised replays both turns (never refused) and asks the third.
    assert runs.run(spending=Spending(budget=Budget(tokens=1_000))) == [2]
    assert runs.shop.pay_calls == 1
    events = read_events(runs.settings)
    reuses = [e for e in events if isinstance(e.body, ModelTurnReused)]
    assert len(reuses) == 2


def test_a_fleet_budget_reserves_each_asked_turn_and_settles_it_with_its_usage(
    runs: Runs,
) -> None:
    # Each turn reserves 200: 110 + 220 settled, a third reservation of 200 passes 500.
    ensure_budget_topic(runs.settings, runs.settings.budget_topic)
    fleet = Spending(fleet_budget=FleetBudget(tokens=500, per_turn_tokens=200))
    with pytest.raises(BudgetExceededError) as raised:
        runs.run(spending=fleet)
    assert raised.value.fleet_id == runs.settings.fleet_id
    assert raised.value.spent_tokens == 330  # the two turns' usage, settled and read back
    # A resume replays both turns without reserving; the third is refused again.
    with pytest.raises(BudgetExceededError):
        runs.run(spending=fleet)
    budget = [e.body for e in read_topic_events(runs.settings, runs.settings.budget_topic)]
    kinds = [b.type for b in budget]
    assert kinds.count("budget_reserved") == 4 and kinds.count("budget_settled") == 2
    assert runs.shop.pay_calls == 1


@pytest.fixture
def secret_plan() -> Any:
    SECRET.on = True
    yield
    SECRET.on = False


@pytest.mark.usefixtures("secret_plan")
def test_turns_with_a_secret_argument_are_recorded_replayed_and_never_hold_it(
    runs: Runs,
) -> None:
    runs.settings = runs.settings.model_copy(update={"redaction_key": SecretStr("k" * 32)})
    assert runs.crashing() == [0, 1]
    assert runs.run() == [2], "both turns replayed: the payment's step replays its outcome"
    assert runs.shop.cards == [CARD], "the tool never received a mark in place of the card"
    assert runs.shop.pay_calls == 1
    records = list(
        read_topic(runs.settings, codec_for(runs.settings), idle_timeout=0.2, max_time=30)
    )
    assert len(records) > 10
    for record in records:
        headers = [v or b"" for _, v in record.headers]
        for part in (record.key or b"", record.value or b"", *headers):
            assert CARD.encode() not in part, record.position
    outcomes = [r.event.body for r in records if r.event is not None]
    marked = [
        b
        for b in outcomes
        if isinstance(b, StepOutcome) and "redacted:hmac-sha256" in (b.result_json or "")
    ]
    assert marked, "the recorded turn keeps the card as its keyed mark"


@pytest.mark.usefixtures("secret_plan")
def test_a_secret_call_with_no_intent_yet_asks_the_model_again(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs.settings = runs.settings.model_copy(update={"redaction_key": SecretStr("k" * 32)})
    named = AgentSteps.step_id

    def dies_before_the_payment(self: AgentSteps, tool: sl.Tool, args: Any) -> str:
        if tool.name == "pay":
            raise Crash("SIGKILL before the payment's intent")
        return named(self, tool, args)

    monkeypatch.setattr(AgentSteps, "step_id", dies_before_the_payment)
    asked: list[int] = []
    with pytest.raises(Crash):
        runs.run(asked=asked)
    assert asked == [0]
    monkeypatch.setattr(AgentSteps, "step_id", named)
    # The turn was recorded with the card as a mark, and its payment has no step: replaying
    # the turn would hand the tool the mark, so the model is asked again for the card.
    assert runs.run() == [0, 1, 2]
    assert runs.shop.cards == [CARD] and runs.shop.pay_calls == 1

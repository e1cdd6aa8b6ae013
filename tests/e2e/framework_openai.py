"""The trip agent on the OpenAI Agents SDK: a scripted ``Model``, tools from ``sl.Tool``s."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from agents import Agent, Model, ModelResponse, Usage, set_tracing_disabled
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic import BaseModel

import stepledger as sl
from stepledger.domain.tools import Tool
from stepledger.integrations import openai_agents as sla
from stepledger_dev.examples.tools import BOOKINGS, EMAIL, PAYMENTS
from tests.e2e.framework_agent import log_model_call, plan_for, prompt


class ChargeArgs(BaseModel):
    amount: int
    currency: str
    customer: str
    memo: str = ""


class BookArgs(BaseModel):
    hotel: str
    nights: int


class EmailArgs(BaseModel):
    to: str
    subject: str
    body: str


ARGS: dict[str, type[BaseModel]] = {PAYMENTS: ChargeArgs, BOOKINGS: BookArgs, EMAIL: EmailArgs}


class ScriptedModel(Model):
    """Asks for the plan's next tool after as many results as it has seen, then answers."""

    def __init__(self, plan: list[tuple[str, dict[str, Any]]]) -> None:
        self.plan = plan

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        items = input if isinstance(input, list) else []
        outputs = [i for i in items if _field(i, "type") == "function_call_output"]
        turn = len(outputs)
        log_model_call(turn)
        # Fresh call ids every time, as a real model gives: they must not name steps.
        if turn < len(self.plan):
            tool, args = self.plan[turn]
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{uuid.uuid4().hex}",
                id=f"fc_{uuid.uuid4().hex}",
                name=sla.model_name(tool),
                arguments=json.dumps(args),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = "trip booked: " + "; ".join(str(_field(o, "output")) for o in outputs)
        message = ResponseOutputMessage(
            type="message",
            id=f"msg_{uuid.uuid4().hex}",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def run_trip(wf: sl.Workflow, tools: dict[str, Tool]) -> Any:
    """Run the agent with the SDK's default error handling; return its final answer."""
    set_tracing_disabled(True)
    model = sla.RecordedModel(ScriptedModel(plan_for(wf.workflow_id)))
    agent = Agent(
        name="trip",
        model=model,
        tools=[sla.function_tool(t, parameters=ARGS[name]) for name, t in tools.items()],
    )
    result = asyncio.run(sla.run(agent, prompt(), wf))
    return result.final_output

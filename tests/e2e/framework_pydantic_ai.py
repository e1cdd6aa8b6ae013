"""The trip agent on Pydantic AI: a scripted ``FunctionModel``, tools from ``sl.Tool``s."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepledger as sl
from stepledger.domain.tools import Tool
from stepledger.integrations import pydantic_ai as slp
from stepledger.integrations._schema import model_name
from tests.e2e.framework_agent import log_model_call, plan_for, prompt
from tests.e2e.framework_openai import ARGS


def scripted(plan: list[tuple[str, dict[str, Any]]]) -> FunctionModel:
    """Asks for the plan's next tool after as many results as it has seen, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)
        ]
        turn = len(returns)
        log_model_call(turn)
        if turn < len(plan):
            tool, args = plan[turn]
            # A fresh call id every time, as a real model gives: it must not name a step.
            call = ToolCallPart(model_name(tool), args, tool_call_id=f"call_{uuid.uuid4().hex}")
            return ModelResponse(parts=[call])
        text = "trip booked: " + "; ".join(str(r.content) for r in returns)
        return ModelResponse(parts=[TextPart(text)])

    return FunctionModel(respond)


def run_trip(wf: sl.Workflow, tools: dict[str, Tool]) -> Any:
    """Run the agent (Pydantic AI's default error handling); return its final answer."""
    agent = Agent(
        scripted(plan_for(wf.workflow_id)),
        name="trip",
        toolsets=[slp.toolset(tools.values(), parameters=ARGS)],
        capabilities=[slp.StepLedgerDurability()],
    )
    result = asyncio.run(slp.run(agent, prompt(), wf))
    return result.output

"""The trip agent on LangGraph: a scripted fake chat model, stepledger's tool node."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

import stepledger as sl
from stepledger.domain.tools import Tool
from stepledger.integrations import langgraph as sll
from stepledger.integrations._schema import model_name
from tests.e2e.framework_agent import log_model_call, plan_for, prompt


class ScriptedChatModel(FakeMessagesListChatModel):
    """Asks for the plan's next tool after as many tool results as it has seen, then answers."""

    plan: list[tuple[str, dict[str, Any]]]

    def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        turn = len(results)
        log_model_call(turn)
        if turn < len(self.plan):
            tool, args = self.plan[turn]
            # A fresh call id every time, as a real model gives: it must not name a step.
            call = {"name": model_name(tool), "args": args, "id": f"call_{uuid.uuid4().hex}"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            message = AIMessage(
                content="trip booked: " + "; ".join(str(r.content) for r in results)
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


def run_trip(wf: sl.Workflow, tools: dict[str, Tool]) -> Any:
    """Run the graph (model -> tools -> model ...); return the last message's text."""
    model = ScriptedChatModel(responses=[], plan=plan_for(wf.workflow_id))
    graph = StateGraph(MessagesState)
    graph.add_node("model", sll.model_node(model))
    graph.add_node("tools", sll.tool_node(tools.values()))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    state = sll.run(graph.compile(), {"messages": [("user", prompt())]}, wf)
    return state["messages"][-1].content

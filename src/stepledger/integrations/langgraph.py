"""LangGraph on stepledger: a tool node whose calls are steps, a model node whose turns are.

::

    from stepledger.integrations import langgraph as sll

    graph = StateGraph(MessagesState)
    graph.add_node("model", sll.model_node(llm.bind_tools(sll.tools([charge, book]))))
    graph.add_node("tools", sll.tool_node([charge, book]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    with sl.Ledger(sl.load_settings(), tools=[charge, book]) as ledger:
        state = sll.run(graph.compile(), {"messages": [("user", "Book the Ritz")]},
                        ledger.workflow("trip-42"))

- :func:`tool_node` runs the tool calls of the last AI message one at a time, in the order
  the model gave them, each as a step named by tool and occurrence (never the model's call
  id).  A stepledger error is re-raised and never becomes a ``ToolMessage``; the tool's own
  error becomes one (what LangGraph's ``ToolNode`` does with ``handle_tool_errors=True``).
- :func:`model_node` records each model answer as a model step (opt-in, through
  :func:`run`'s ``record_model``): a resume replays it instead of asking the model again.
- :func:`history_from_log` renders the log's steps as LangChain messages.

**No checkpointer backed by the ledger, on purpose.**  A LangGraph checkpoint is the whole
graph state, the conversation included; the ledger records what the agent *did* and never
the conversation (its prompts may hold what redaction keeps off the wire), and a checkpoint
written beside a step's intent and outcome would be a second record that a crash can leave
disagreeing with the log.  The graph needs none: :func:`run` uses the workflow id as the
thread id, and a resumed graph runs from its input again with every recorded step (and
model turn) replayed from the log, or continues from :func:`history_from_log`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        SystemMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.tools import BaseTool, StructuredTool
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError(
        "stepledger.integrations.langgraph needs LangGraph: pip install 'stepledger[langgraph]'"
    ) from exc
from pydantic import BaseModel

from stepledger.domain.tools import Tool
from stepledger.domain.usage import TurnUsage
from stepledger.errors import StepLedgerError
from stepledger.integrations import _core
from stepledger.integrations._core import AgentSteps, ToolFailure
from stepledger.integrations._schema import arguments_model, model_name, tool_function
from stepledger.integrations._turns import Asked, Spending
from stepledger.producer.workflow import Workflow

__all__ = ["history_from_log", "model_node", "run", "steps_for", "tool_node", "tools"]

State = Any
"""A graph state (a mapping with the messages under ``messages_key``)."""


def tools(
    sl_tools: Iterable[Tool], parameters: Mapping[str, type[BaseModel]] | None = None
) -> list[StructuredTool]:
    """LangChain tools for a model's ``bind_tools`` (schemas without ``idempotency_key``)."""
    made = []
    for tool in sl_tools:
        schema = (parameters or {}).get(tool.name) or arguments_model(tool)
        fn = tool_function(tool)
        made.append(
            StructuredTool.from_function(
                func=_refuse_direct(tool),
                name=model_name(tool),
                description=(fn.__doc__ if fn else None) or tool.name,
                args_schema=schema,
            )
        )
    return made


def _refuse_direct(tool: Tool) -> Callable[..., Any]:
    def direct(**_: Any) -> Any:
        raise StepLedgerError(
            f"tool {tool.name!r} runs in stepledger's tool_node, not by itself", tool=tool.name
        )

    return direct


class _ToolNode:
    """Runs the last AI message's tool calls as steps, one at a time, in the model's order."""

    def __init__(self, sl_tools: Iterable[Tool], messages_key: str) -> None:
        self.by_name = {model_name(t): t for t in sl_tools}
        self.messages_key = messages_key

    def __call__(self, state: State) -> dict[str, list[ToolMessage]]:
        messages = state[self.messages_key]
        last = messages[-1]
        calls = getattr(last, "tool_calls", None) or []
        steps = _core.current()
        out = []
        for call in calls:
            tool = self.by_name.get(call["name"])
            if tool is None:
                content = f"Error: {call['name']!r} is not a tool here"
                out.append(ToolMessage(content, tool_call_id=call["id"], status="error"))
                continue
            try:
                result = steps.call_sync(tool, call.get("args") or {})
            except ToolFailure as failure:
                # The recorded error text, so a replayed failure reads as the first one did.
                known = steps.workflow.state.steps.get(failure.step_id)
                content = f"Error: {known.error if known else failure.error}"
                out.append(ToolMessage(content, tool_call_id=call["id"], status="error"))
                continue
            out.append(ToolMessage(_core.to_json_text(result), tool_call_id=call["id"]))
        return {self.messages_key: out}


def tool_node(sl_tools: Iterable[Tool], *, messages_key: str = "messages") -> _ToolNode:
    """A graph node running the model's tool calls as steps; stepledger errors re-raised."""
    return _ToolNode(list(sl_tools), messages_key)


def _said(messages: Sequence[Any]) -> list[Any]:
    """What messages say, without the ids a run makes up."""
    out = []
    for m in messages:
        calls = [(c["name"], c.get("args")) for c in getattr(m, "tool_calls", None) or []]
        out.append([getattr(m, "type", type(m).__name__), _text(m), calls])
    return out


def _text(message: Any) -> Any:
    if isinstance(message, tuple):
        return list(message)
    return getattr(message, "content", message)


class _ModelNode:
    """Asks the model for its next message; in a recording run, each answer is a step."""

    def __init__(self, model: Any, messages_key: str) -> None:
        self.model = model
        self.messages_key = messages_key

    def __call__(self, state: State) -> dict[str, list[BaseMessage]]:
        messages = state[self.messages_key]

        def ask() -> Asked:
            answer = message_to_dict(self.model.invoke(messages))
            return answer, usage_of(answer, _model_name(self.model))

        turn = _core.current().model_turn_sync(_said(messages), ask, calls_of)
        return {self.messages_key: messages_from_dict([turn.response])}


def _model_name(model: Any) -> str | None:
    """The chat model's name (``model_name`` or ``model``), through a ``bind_tools`` binding."""
    bound = getattr(model, "bound", model)
    for attribute in ("model_name", "model"):
        name = getattr(bound, attribute, None)
        if isinstance(name, str) and name:
            return name
    return None


def calls_of(message: Any) -> list[tuple[str, Any]]:
    """The tool calls of an answer as a message dict (``message_to_dict``)."""
    data = message.get("data") if isinstance(message, dict) else None
    calls = (data or {}).get("tool_calls") or []
    return [(str(c.get("name")), c.get("args")) for c in calls if isinstance(c, dict)]


def usage_of(message: Mapping[str, Any], model: str | None = None) -> TurnUsage | None:
    """The usage of one answer from its message as a dict (LangChain's ``usage_metadata``)."""
    data = message.get("data") or {}
    usage = data.get("usage_metadata")
    if not isinstance(usage, Mapping):
        return None
    given = (data.get("response_metadata") or {}).get("model_name")
    inputs = usage.get("input_token_details") or {}
    outputs = usage.get("output_token_details") or {}
    return TurnUsage(
        model=given or model,
        input_tokens=usage.get("input_tokens") or 0,
        output_tokens=usage.get("output_tokens") or 0,
        cached_tokens=inputs.get("cache_read") or 0,
        reasoning_tokens=outputs.get("reasoning") or 0,
    )


def model_node(model: Any, *, messages_key: str = "messages") -> _ModelNode:
    """A graph node asking ``model`` (a chat model or runnable) for its next message.

    In a run with ``record_model`` (the default of :func:`run`), each answer is a model
    step: a resume replays it and the model is not asked again.
    """
    return _ModelNode(model, messages_key)


def steps_for(
    workflow: Workflow, *, record_model: bool = True, spending: Spending | None = None
) -> AgentSteps:
    """The step namer and runner of one run of a graph on ``workflow``.

    ``spending`` declares the volatile parts of a request (left out of its digest), the
    price table and the workflow's model budget (:class:`stepledger.integrations.Spending`).
    """
    return _core.agent_steps(workflow, record_model=record_model, spending=spending)


def run(
    graph: Any,
    input: Any,
    workflow: Workflow | AgentSteps,
    *,
    config: dict[str, Any] | None = None,
    strict: bool = False,
    **kwargs: Any,
) -> Any:
    """``graph.invoke`` with its tool calls (and model turns) as steps; thread id = workflow id.

    A node that runs tools itself (LangGraph's ``ToolNode``, a tool as a node) is warned
    about (UnrecordedToolWarning); ``strict=True`` refuses it with ToolDefinitionError.
    """
    why = "LangGraph runs them again on every resume"
    _core.outside_the_ledger(_not_steps(graph), why, strict=strict)
    steps = workflow if isinstance(workflow, AgentSteps) else steps_for(workflow)
    configurable = {
        "thread_id": steps.workflow.workflow_id,
        **(config or {}).get("configurable", {}),
    }
    token = _core.bind(steps)
    try:
        return graph.invoke(input, {**(config or {}), "configurable": configurable}, **kwargs)
    finally:
        _core.unbind(token)


def _not_steps(graph: Any) -> list[str]:
    """The tools the graph's nodes run outside :func:`tool_node` (a ToolNode, a tool node)."""
    found: list[str] = []
    for node in (getattr(graph, "nodes", None) or {}).values():
        bound = getattr(node, "bound", node)
        if isinstance(bound, BaseTool):
            found.append(bound.name)
        by_name = getattr(bound, "tools_by_name", None)
        if isinstance(by_name, Mapping):
            found += [str(name) for name in by_name]
    return found


def history_from_log(workflow: Workflow) -> list[BaseMessage]:
    """The log's tool steps as messages: an AI tool call and its ToolMessage per step.

    Steps that did not succeed are told in one system message, so the model knows what is
    open; a resumed run given this history continues after them.
    """
    out: list[BaseMessage] = []
    done, notes = _core.replayed_steps(workflow)
    for step in done:
        call_id = f"sl-{step.step_id}"
        args = json.loads(step.arguments_json or "{}")
        call = {"name": model_name(step.tool), "args": args, "id": call_id, "type": "tool_call"}
        out.append(AIMessage(content="", tool_calls=[call]))
        out.append(ToolMessage(step.result_json or "", tool_call_id=call_id))
    if notes:
        out.append(SystemMessage("Steps not done: " + "; ".join(notes)))
    return out

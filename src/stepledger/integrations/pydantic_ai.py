"""Pydantic AI on stepledger: a durability capability on ``pydantic_ai.durable_exec``.

::

    from stepledger.integrations import pydantic_ai as slp

    agent = Agent(model, toolsets=[slp.toolset([charge, book])],
                  capabilities=[slp.StepLedgerDurability()])
    with sl.Ledger(sl.load_settings(), tools=[charge, book]) as ledger:
        result = asyncio.run(slp.run(agent, "Book the Ritz", ledger.workflow("trip-42")))

Built the way Pydantic AI's Temporal, DBOS and Prefect integrations are: a
``BaseDurabilityCapability`` with a ``CallableOperationBackend`` that runs each durable
operation as one unit, here a step of the workflow:

- every **model request** is a model step (read-only, named ``model#n``; its argument is a
  digest of the messages, its result the serialized response): a resume replays it and the
  model is not asked again (``record_model=False`` turns this off);
- every **tool call** is a step named by tool and occurrence (``bookings.book#1``, never the
  model's tool-call id).  :func:`toolset` builds a function toolset from ``sl.Tool``\\ s: the
  schema leaves out ``idempotency_key``, which reaches the tool from the step; a plain
  Pydantic AI tool runs as a read-only step;
- tool calls run one at a time in the order of the model's response (the engine declares
  sequential tools), and stepledger's errors leave the run as they are.
"""

from __future__ import annotations

import contextvars
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

try:
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        BoundDurableOperation,
        CallableOperationBackend,
        DurabilityEngineSpec,
        DurableOperationId,
        JournalOperationNamer,
        ModelRequestId,
        ModelRequestParams,
        RoleBasedOperationConfig,
        ToolsetCallToolId,
        ToolsetCallToolParams,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.tools import Tool as AiTool
    from pydantic_ai.toolsets import FunctionToolset
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError(
        "stepledger.integrations.pydantic_ai needs Pydantic AI: "
        "pip install 'stepledger[pydantic-ai]'"
    ) from exc

from pydantic import BaseModel

from stepledger.domain.tools import Tool
from stepledger.domain.usage import TurnUsage
from stepledger.integrations import _core
from stepledger.integrations._core import AgentSteps, ToolFailure
from stepledger.integrations._schema import model_name, parameters_schema, tool_function
from stepledger.integrations._turns import Asked, Spending
from stepledger.producer.workflow import Workflow

TOOLSET_ID = "stepledger"
"""The id of the toolsets :func:`toolset` builds (their calls are steps already)."""
__all__ = ["StepLedgerDurability", "history_from_log", "run", "steps_for", "toolset"]

_MARK = "_stepledger_tool"
_PARAMS: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "stepledger_pydantic_ai_params", default=None
)


def toolset(
    tools: Iterable[Tool],
    *,
    parameters: Mapping[str, type[BaseModel]] | None = None,
    id: str = TOOLSET_ID,
) -> FunctionToolset[Any]:
    """A function toolset of ``sl.Tool``\\ s, each call a step (``idempotency_key`` not shown).

    ``parameters`` gives the argument model of a tool not made from a function, by tool name.
    """
    made: list[AiTool[Any]] = []
    for tool in tools:
        schema = parameters_schema(tool, (parameters or {}).get(tool.name))
        made.append(
            AiTool.from_schema(
                _runner(tool),
                name=model_name(tool),
                description=_describe(tool),
                json_schema=schema,
                takes_ctx=False,
            )
        )
    return FunctionToolset(made, id=id)


def _describe(tool: Tool) -> str:
    fn = tool_function(tool)
    return (inspect.getdoc(fn) if fn else None) or tool.name


def _runner(tool: Tool) -> Callable[..., Awaitable[Any]]:
    async def call(**arguments: Any) -> Any:
        try:
            return await _core.current().call(tool, arguments)
        except ToolFailure as failure:
            raise failure.error from failure.error.__cause__

    call.__name__ = tool.name.replace(".", "_")
    setattr(call, _MARK, tool)
    return call


class _Backend(CallableOperationBackend[None]):
    """Runs each durable operation of a run as a step of the current workflow."""

    def __init__(self, agent_name: str) -> None:
        config = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)
        super().__init__(namer=JournalOperationNamer(agent_name), config=config)

    def bind(self, operation: Any) -> BoundDurableOperation[Any, Any, Any]:
        inner = super().bind(operation)
        return _WithParams(inner)

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        params = _PARAMS.get()
        steps = _core.current()
        if isinstance(operation_id, ModelRequestId) and isinstance(params, ModelRequestParams):

            async def ask() -> Asked:
                payload = await body()
                return payload, usage_of(payload)

            turn = await steps.model_turn(_said(params.messages), ask, calls_of)
            return turn.response
        if isinstance(operation_id, ToolsetCallToolId) and isinstance(
            params, ToolsetCallToolParams
        ):
            if params.name in _SL_TOOLS.get():
                return await body()  # the tool's own function runs the step (see toolset)
            plain = Tool(name=params.name, read_only=True)

            async def run_plain(_: dict[str, Any], __: str) -> object:
                return await body()

            return await steps.call(plain, params.tool_args, run_plain)
        return await body()


_PART_FIELDS = ("part_kind", "content", "tool_name", "args")


def _said(messages: Sequence[Any]) -> list[Any]:
    """What the messages say (not when, nor under which run or call id): the digest's input."""
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return [
        [m.get("kind"), [{k: p.get(k) for k in _PART_FIELDS} for p in m.get("parts", [])]]
        for m in dumped
    ]


def calls_of(payload: Any) -> list[tuple[str, Any]]:
    """The tool calls of a ``ModelResponse`` as JSON, arguments parsed."""
    found: list[tuple[str, Any]] = []
    for part in payload.get("parts", []) if isinstance(payload, dict) else []:
        if isinstance(part, dict) and part.get("part_kind") == "tool-call":
            args = part.get("args")
            try:
                found.append(
                    (
                        str(part.get("tool_name")),
                        json.loads(args) if isinstance(args, str) else args,
                    )
                )
            except ValueError:
                continue  # arguments that are not JSON reach no tool as a step
    return found


def usage_of(payload: object) -> TurnUsage | None:
    """The usage of one model request from its ``ModelResponse`` as JSON (``RequestUsage``)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("usage"), dict):
        return None
    usage = payload["usage"]
    details = usage.get("details") or {}
    return TurnUsage(
        model=payload.get("model_name"),
        input_tokens=usage.get("input_tokens") or 0,
        output_tokens=usage.get("output_tokens") or 0,
        cached_tokens=usage.get("cache_read_tokens") or 0,
        reasoning_tokens=usage.get("output_reasoning_tokens")
        or details.get("reasoning_tokens")
        or 0,
    )


_SL_TOOLS: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "stepledger_pydantic_ai_tools", default=frozenset()
)


class _WithParams:
    """A bound operation that lets the backend see the call's parameters."""

    def __init__(self, inner: BoundDurableOperation[Any, Any, Any]) -> None:
        self._inner = inner

    @property
    def operation(self) -> Any:
        return self._inner.operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        token = _PARAMS.set(params)
        try:
            return await self._inner(params, config=config)
        finally:
            _PARAMS.reset(token)


class StepLedgerDurability(BaseDurabilityCapability[Any]):
    """The capability that runs an agent's model requests and tool calls as workflow steps."""

    engine_spec = DurabilityEngineSpec(
        engine_name="stepledger",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        unsupported_runtime_toolset_kinds=frozenset(),
        wrapped_toolset_kinds=frozenset({"function"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-always",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=False,
        sequential_tools_in_durable_context=True,
        tool_config_key="stepledger",
    )

    @property
    def in_durable_context(self) -> bool:
        """True while a stepledger run (:func:`run`) is under way."""
        return _core._CURRENT.get() is not None

    def get_durable_operation_backend(self) -> _Backend:
        """The backend that runs each operation as a step."""
        return _Backend(self.name or "agent")


def steps_for(
    workflow: Workflow, *, record_model: bool = True, spending: Spending | None = None
) -> AgentSteps:
    """The step namer and runner of one run of an agent on ``workflow``.

    ``spending`` declares the volatile parts of a request (left out of its digest), the
    price table and the workflow's model budget (:class:`stepledger.integrations.Spending`).
    """
    return _core.agent_steps(workflow, record_model=record_model, spending=spending)


async def run(
    agent: Agent[Any, Any],
    prompt: str | Sequence[Any] | None,
    workflow: Workflow | AgentSteps,
    *,
    strict: bool = False,
    **kwargs: Any,
) -> Any:
    """``agent.run`` with its model requests and tool calls recorded as steps of ``workflow``.

    A tool outside :func:`toolset` is warned about (UnrecordedToolWarning): a plain function
    tool runs as a read-only step, another toolset's (MCP) not as a step at all, so a resume
    may run either again.  ``strict=True`` refuses them with ToolDefinitionError instead.
    """
    leaves: list[Any] = []
    for ts in agent.toolsets:
        ts.apply(leaves.append)
    ours = {
        name: tool
        for ts in leaves
        if isinstance(ts, FunctionToolset) and ts.id == TOOLSET_ID
        for name, tool in ts.tools.items()
    }
    why = (
        "a resume may run them again (a plain tool runs as a read-only step, a tool of "
        "another toolset not as a step at all)"
    )
    _core.outside_the_ledger(_not_steps(leaves), why, strict=strict)
    steps = workflow if isinstance(workflow, AgentSteps) else steps_for(workflow)
    names = frozenset(ours)
    steps.know(getattr(t.function, _MARK) for t in ours.values() if hasattr(t.function, _MARK))
    token, tools = _core.bind(steps), _SL_TOOLS.set(names)
    try:
        return await agent.run(prompt, **kwargs)
    finally:
        _SL_TOOLS.reset(tools)
        _core.unbind(token)


def _not_steps(leaves: Iterable[Any]) -> list[str]:
    """The tools of leaf toolsets that are not :func:`toolset`'s (their calls are not steps)."""
    found: list[str] = []
    for ts in leaves:
        if isinstance(ts, FunctionToolset):
            if ts.id != TOOLSET_ID:
                found += list(ts.tools)
        else:
            found.append(f"toolset {ts.label}")
    return found


def history_from_log(workflow: Workflow) -> list[ModelMessage]:
    """The log's tool steps as messages: a tool call and its return per settled step.

    Steps that did not succeed are told in one system prompt part, so the model knows what
    is open; pass the list as ``message_history`` and the run continues after them.
    """
    out: list[ModelMessage] = []
    done, notes = _core.replayed_steps(workflow)
    for step in done:
        call_id = f"sl-{step.step_id}"
        name = model_name(step.tool)
        args = json.loads(step.arguments_json or "{}")
        result = json.loads(step.result_json) if step.result_json else None
        out.append(ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id)]))
        out.append(ModelRequest(parts=[ToolReturnPart(name, result, tool_call_id=call_id)]))
    if notes:
        out.append(ModelRequest(parts=[SystemPromptPart("Steps not done: " + "; ".join(notes))]))
    return out

"""The OpenAI Agents SDK on stepledger: function tools as steps, model responses as steps.

::

    from stepledger.integrations import openai_agents as sla

    agent = Agent(name="trip", model=sla.RecordedModel(model),
                  tools=[sla.function_tool(charge), sla.function_tool(book)])
    with sl.Ledger(sl.load_settings(), tools=[charge, book]) as ledger:
        result = asyncio.run(sla.run(agent, "Book the Ritz", ledger.workflow("trip-42")))

- :func:`function_tool` builds the SDK's ``FunctionTool`` from an ``sl.Tool``: its schema
  leaves out ``idempotency_key`` (the key reaches the tool from the step), its results
  reach the model as JSON, and each call is a step named by tool and occurrence
  (:mod:`stepledger.integrations._core`), never by the model's call id.
- A ``StepLedgerError`` never becomes model text, whatever the agent's error handling:
  it leaves the run as itself (``except sl.StepCompensatedError`` matches), not wrapped in
  the SDK's ``UserError``.  Only the tool's own error, recorded as a failed outcome, is
  given to the SDK's ``failure_error_function`` (its default text, or yours).
- :class:`RecordedModel` records each response as a model step (opt-in): a resume replays
  it instead of asking the model again.
- :func:`history_from_log` renders the log's steps as the SDK's input items, for a resume
  that lets the model continue from the log instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

try:
    from agents import FunctionTool, Model, ModelResponse, RunConfig, Runner, RunResult, Usage
    from agents.exceptions import AgentsException, UserError
    from agents.items import TResponseInputItem, TResponseOutputItem
    from agents.run_config import ToolExecutionConfig
    from agents.tool import ToolErrorFunction, default_tool_error_function
    from agents.tool_context import ToolContext
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError(
        "stepledger.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stepledger[openai-agents]'"
    ) from exc
from pydantic import BaseModel, TypeAdapter

from stepledger.domain.tools import Tool
from stepledger.domain.usage import TurnUsage
from stepledger.errors import StepLedgerError, ToolDefinitionError
from stepledger.integrations import _core
from stepledger.integrations._core import AgentSteps, ToolFailure
from stepledger.integrations._schema import (
    arguments_model,
    model_name,
    parameters_schema,
    tool_function,
)
from stepledger.integrations._turns import Asked, Spending
from stepledger.producer.workflow import Workflow

__all__ = [
    "RecordedModel",
    "function_tool",
    "history_from_log",
    "model_name",
    "parameters_schema",
    "run",
    "steps_for",
]

_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(TResponseOutputItem)
_MARK = "_stepledger_tool"
"""The attribute that marks a FunctionTool whose calls are steps (the sl.Tool it runs)."""
_ESCAPES: dict[type[BaseException], type[BaseException]] = {}


def function_tool(
    tool: Tool,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: type[BaseModel] | None = None,
    failure_error_function: ToolErrorFunction | None = default_tool_error_function,
) -> FunctionTool:
    """The SDK's FunctionTool for an ``sl.Tool``: each call runs as a step of the current run.

    ``failure_error_function`` turns the tool's own recorded failure into text for the model
    (the SDK's default text unless given; None lets it fail the run).  Errors stepledger
    raises (a compensated step, a step in doubt, a mismatch) always leave the run as they are.
    """
    schema = parameters_schema(tool, parameters)
    validator = parameters or arguments_model(tool)
    fn = tool_function(tool)

    async def invoke(ctx: ToolContext[Any], raw: str) -> Any:
        steps = _core.current()
        try:
            args = json.loads(raw or "{}")
            if validator is not None:
                args = validator.model_validate(args).model_dump(mode="json")
        except ValueError as exc:  # the model's arguments are not the tool's: no step
            return await _told(failure_error_function, ctx, exc)
        try:
            result = await steps.call(tool, args, call_id=ctx.tool_call_id)
        except ToolFailure as failure:
            error = failure.error if isinstance(failure.error, Exception) else Exception()
            return await _told(failure_error_function, ctx, error)
        except StepLedgerError as exc:
            raise escaped(exc) from exc.__cause__
        return _core.to_json_text(result)

    made = FunctionTool(
        name=name or model_name(tool),
        description=description or (inspect.getdoc(fn) if fn else None) or tool.name,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
    setattr(made, _MARK, tool)
    return made


async def _told(
    failure_error_function: ToolErrorFunction | None, ctx: ToolContext[Any], error: Exception
) -> Any:
    """What the model is told of a tool's own error (raised when no function is given)."""
    if failure_error_function is None:
        raise error
    text = failure_error_function(ctx, error)
    return await text if inspect.isawaitable(text) else text


def escaped(exc: BaseException) -> BaseException:
    """The same error, also an ``AgentsException``, so the SDK lets it through unwrapped."""
    if isinstance(exc, AgentsException):
        return exc
    kind = type(exc)
    escape = _ESCAPES.get(kind)
    if escape is None:
        escape = type(kind.__name__, (kind, AgentsException), {"__module__": kind.__module__})
        _ESCAPES[kind] = escape
    copy = escape.__new__(escape)
    copy.__dict__.update(exc.__dict__)
    copy.args = exc.args
    cast(Any, copy).run_data = None
    return copy


class RecordedModel(Model):
    """A model whose every response is recorded as a step and replayed on a resume (opt-in)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Replay the recorded response to this request, or ask the model and record it."""
        steps = _core.current()
        named = _arguments(args, kwargs)
        tools = list(named.get("tools") or [])
        request = {
            "system_instructions": named.get("system_instructions"),
            "input": named.get("input"),
            "tools": [getattr(t, "name", str(t)) for t in tools],
        }

        async def ask() -> Asked:
            response = await self.model.get_response(*args, **kwargs)
            output = [item.model_dump(mode="json") for item in response.output]
            answer = {"output": output, "response_id": response.response_id}
            return answer, usage_of(response.usage, _model_name(self.model))

        turn = await steps.model_turn(request, ask, calls_of)
        recorded = turn.response
        items = [_OUTPUT_ITEM.validate_python(item) for item in recorded["output"]]
        ours = {t.name for t in tools if hasattr(t, _MARK)}
        steps.turnstile.expect(
            getattr(item, "call_id", "")
            for item in items
            if getattr(item, "type", "") == "function_call" and getattr(item, "name", "") in ours
        )
        # A replayed turn reports the usage it was recorded with (the run's total is what the
        # turns cost); that it was replayed, not spent again, is in the log and on its span.
        usage = sdk_usage(turn.usage)
        return ModelResponse(output=items, usage=usage, response_id=recorded["response_id"])

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Streaming is not recorded: refused rather than run without a record."""
        raise ToolDefinitionError(
            "a RecordedModel does not stream: run the agent with Runner.run (sla.run)"
        )


def calls_of(response: Any) -> list[tuple[str, Any]]:
    """The function calls of a recorded response (``{"output": [...]}``), arguments parsed."""
    found: list[tuple[str, Any]] = []
    for item in response.get("output", []) if isinstance(response, dict) else []:
        if isinstance(item, dict) and item.get("type") == "function_call":
            try:
                found.append((str(item.get("name")), json.loads(item.get("arguments") or "{}")))
            except ValueError:
                continue  # arguments that are not JSON reach no tool as a step
    return found


def usage_of(usage: Usage | None, model: str | None = None) -> TurnUsage | None:
    """The usage of one response from the SDK's ``Usage``."""
    if usage is None:
        return None
    return TurnUsage(
        model=model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.input_tokens_details.cached_tokens or 0,
        reasoning_tokens=usage.output_tokens_details.reasoning_tokens or 0,
    )


def sdk_usage(usage: TurnUsage | None) -> Usage:
    """The SDK's ``Usage`` of one request from a turn's recorded usage (empty without one)."""
    if usage is None:
        return Usage()
    return Usage(
        requests=1,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=usage.cached_tokens, cache_write_tokens=0
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
    )


def _model_name(model: Model) -> str | None:
    """The name of the model a ``Model`` calls (the SDK's OpenAI models keep it as ``model``)."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``get_response``'s arguments by name (the SDK passes them by keyword)."""
    names = list(inspect.signature(Model.get_response).parameters)[1:]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def steps_for(
    workflow: Workflow, *, record_model: bool = True, spending: Spending | None = None
) -> AgentSteps:
    """The step namer and runner of one run of an agent on ``workflow``.

    ``spending`` declares the volatile parts of a request (left out of its digest), the
    price table and the workflow's model budget (:class:`stepledger.integrations.Spending`).
    """
    return _core.agent_steps(workflow, record_model=record_model, spending=spending)


async def run(
    agent: Any,
    input: str | list[TResponseInputItem],
    workflow: Workflow | AgentSteps,
    *,
    strict: bool = False,
    **kwargs: Any,
) -> RunResult:
    """``Runner.run`` with every tool call and model response of the run recorded as steps.

    The SDK runs a turn's function tool calls one at a time, in the model's order
    (:func:`_in_order`).  A StepLedgerError raised inside the run leaves it as itself (never
    as ``UserError``).  A tool of the agent (or of an agent it hands off to) not made with
    :func:`function_tool` is warned about (UnrecordedToolWarning); ``strict=True`` refuses
    it with ToolDefinitionError before anything runs.
    """
    _core.outside_the_ledger(
        _not_steps(agent), "the SDK runs them again on every resume", strict=strict
    )
    kwargs["run_config"] = _in_order(kwargs.get("run_config"))
    steps = workflow if isinstance(workflow, AgentSteps) else steps_for(workflow)
    steps.know(getattr(t, _MARK) for t in getattr(agent, "tools", []) if hasattr(t, _MARK))
    token = _core.bind(steps)
    try:
        return await Runner.run(agent, input, **kwargs)
    except UserError as exc:
        cause = exc.__cause__
        if isinstance(cause, StepLedgerError):
            raise cause from cause.__cause__
        raise
    finally:
        _core.unbind(token)


def _not_steps(agent: Any) -> list[str]:
    """The tools of the agent and of the agents it hands off to that are not steps."""
    found: list[str] = []
    seen: set[int] = set()
    agents = [agent]
    while agents:
        current = agents.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for tool in getattr(current, "tools", None) or []:
            if not hasattr(tool, _MARK):
                found.append(str(getattr(tool, "name", type(tool).__name__)))
        for server in getattr(current, "mcp_servers", None) or []:
            found.append(f"MCP server {getattr(server, 'name', type(server).__name__)}")
        agents += [h for h in getattr(current, "handoffs", None) or [] if hasattr(h, "tools")]
    return found


def _in_order(run_config: RunConfig | dict[str, Any] | None) -> RunConfig | dict[str, Any]:
    """The run's config with the SDK running a turn's function tool calls one at a time.

    By default the SDK starts every function tool call of a turn at once, and which of them
    it holds back (its own approval, a guardrail's rejection) only it knows: the order in
    which the calls reach their steps would be the event loop's.  With
    ``tool_execution.max_function_tool_concurrency=1`` the SDK starts each call once the one
    before it has finished, in the response's order, and a call it holds back never starts,
    so the order of steps is the model's with nothing to wait for.  A config asking for
    more concurrency is refused.  A dict (or None) stays a dict, so the runner still closes
    the model provider it makes.
    """
    if isinstance(run_config, RunConfig):
        serial = _one_at_a_time(run_config.tool_execution)
        return dataclasses.replace(run_config, tool_execution=serial)
    if run_config is not None and not isinstance(run_config, dict):
        return run_config  # the SDK refuses it with its own message
    given = dict(run_config or {})
    given["tool_execution"] = _one_at_a_time(given.get("tool_execution"))
    return given


def _one_at_a_time(
    execution: ToolExecutionConfig | Mapping[str, Any] | None,
) -> ToolExecutionConfig:
    if isinstance(execution, Mapping):
        execution = ToolExecutionConfig(**execution)
    execution = execution or ToolExecutionConfig()
    limit = execution.max_function_tool_concurrency
    if limit not in (None, 1):
        raise ToolDefinitionError(
            f"run_config.tool_execution.max_function_tool_concurrency={limit}: stepledger "
            "runs a model turn's tool calls one at a time, in the model's order, so that the "
            "order of steps never depends on the event loop; leave it unset (or 1)"
        )
    return dataclasses.replace(execution, max_function_tool_concurrency=1)


def history_from_log(
    workflow: Workflow, names: Callable[[str], str] | None = None
) -> list[TResponseInputItem]:
    """The log's tool steps as input items: a call and its output per settled step.

    Steps that did not succeed are told as one developer message, so the model knows what
    is open; a resumed run given this history continues after them
    (:meth:`Workflow.fast_forward`).
    """
    rename = names or model_name
    items: list[Any] = []
    done, notes = _core.replayed_steps(workflow)
    for step in done:
        call_id = f"sl-{step.step_id}"
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": rename(step.tool),
                "arguments": step.arguments_json,
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": step.result_json or ""}
        )
    if notes:
        items.append({"role": "developer", "content": "Steps not done: " + "; ".join(notes)})
    return cast(list[TResponseInputItem], items)

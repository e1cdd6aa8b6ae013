"""What every framework integration needs: step ids a model cannot change, model turns as steps.

A model's tool-call ids change on every run, so they never name a step.  A step is the
**logical call**, named by its tool and occurrence (``payments.charge#1``):

- a call of an effectful tool is the next occurrence of that tool this run has not used
  yet, whatever its wording: the n-th call of ``charge`` in a run is the n-th recorded
  ``charge`` step (one in doubt is settled first, one with an outcome replays it), and
  only a call past the recorded ones is a new step.  The workflow then checks that the
  call is the recorded one by its fingerprint (tool, step, the arguments that identify it,
  secrets as keyed HMACs; :mod:`stepledger.domain.fingerprint`): another amount or another
  card raises :class:`~stepledger.errors.PlanMismatchError` naming both calls, while a
  re-worded argument the tool does not count among its ``identity_args`` (a memo, an
  email body) is the same call;
- a call of a read-only tool (a lookup, a model turn) is a recorded step of that tool with
  the same fingerprint that this run has not used yet, or a new one: nothing happens
  twice when it is asked again, and a model may look things up in any order.

A resumed agent that runs from the top replays its recorded steps, one that continues from
a context rebuilt from the log gets the recorded result when the model asks again for a
call that was made, and a call never made becomes a new step after the recorded prefix
(:meth:`~stepledger.producer.workflow.Workflow.fast_forward`).

A **model turn** is a read-only step (tool ``model``) whose argument is a digest of the
request (:func:`request_digest`, the canonical digest fingerprints use) and whose result is
the serialized response with its usage: a resume replays the recorded turn instead of
asking the model again, and recovery never resolves it (a read-only intent in doubt is
simply asked again).  Recording turns saves the cost of asking the model again and keeps its
plan, while correctness comes from the tool steps alone; when a turn is asked or replayed,
its usage, budget, volatile parts and secrets are :mod:`stepledger.integrations._asking`'s.

Tool calls of one model turn run one at a time, in the order of the turn's response: the
framework is made to dispatch them so, and a turnstile
(:mod:`stepledger.integrations._turnstile`) refuses a call that shows otherwise, so the
order of steps does not depend on the event loop (nor on a clock).

A framework tool beside the ledger's that is not a step is warned about
(:class:`~stepledger.errors.UnrecordedToolWarning`), or refused with ``strict=True``
(:func:`outside_the_ledger`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic_core import to_jsonable_python

from stepledger.domain.context import StepSummary
from stepledger.domain.replay import mismatch, occurrences, same_call
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Tool
from stepledger.errors import (
    PlanMismatchError,
    StepLedgerError,
    ToolCallError,
    ToolDefinitionError,
    UnrecordedToolWarning,
)
from stepledger.integrations._asking import ModelTurns
from stepledger.integrations._turn_secrets import Calls
from stepledger.integrations._turns import Asked, Spending, Turn
from stepledger.integrations._turns import request_digest as request_digest
from stepledger.integrations._turnstile import Turnstile
from stepledger.producer.stepcall import recorded_result
from stepledger.producer.workflow import Workflow
from stepledger.wire import AUTO_STEP_ID_SEPARATOR, MODEL_STEP_TOOL

MODEL_TOOL = MODEL_STEP_TOOL
"""The tool name of recorded model turns (a read-only step)."""


class ToolFailure(Exception):
    """A tool's own error, recorded as a failed outcome: the model may be told about it."""

    def __init__(self, error: BaseException, step_id: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.step_id = step_id


def model_tool(name: str = MODEL_TOOL) -> Tool:
    """The read-only tool a model turn is recorded under."""
    return Tool(name=name, read_only=True, timeout_s=600.0)


def to_json_text(value: Any) -> str:
    """A tool result as the JSON text a model reads (strings stay as they are)."""
    if isinstance(value, str):
        return value
    return json.dumps(to_jsonable_python(value, fallback=str), ensure_ascii=False, sort_keys=True)


class AgentSteps:
    """Names, orders and runs the steps a model asks for in one run of one workflow."""

    def __init__(
        self, workflow: Workflow, *, model: Tool | None = None, spending: Spending | None = None
    ) -> None:
        self.workflow = workflow
        self.model = model
        """The tool model turns are recorded under, or None: turns are not recorded."""
        self.turnstile = Turnstile()
        self.used: set[str] = set()
        """The steps this run has named (a recorded step is used once per run)."""
        self._known: dict[str, Tool] = {}
        self.lock = asyncio.Lock()
        """Held while a step of the run is named and run on the event loop."""
        self.sync_lock = threading.Lock()
        """Held while a step of the run is named and run from synchronous code."""
        workflow.fast_forward()
        self.turns = ModelTurns(self, spending or Spending())
        """The run's model turns: asked or replayed, priced, budgeted, secrets marked."""

    def step_id(self, tool: Tool, arguments: Mapping[str, Any]) -> str:
        """The step this call is (see the module doc): by occurrence, or by fingerprint for
        a read-only tool; a call past the recorded steps is a new one."""
        unused = [
            s for s in occurrences(self.workflow.state, tool.name) if s.step_id not in self.used
        ]
        if not tool.read_only and unused:
            return self._use(unused[0].step_id)
        if tool.read_only:
            legacy = functools.cache(lambda: tool.legacy_digest(arguments))  # on a miss only
            for step in unused:
                if same_call(step, self._fingerprint(step.step_id, tool, arguments), legacy):
                    return self._use(step.step_id)
        state = self.workflow.state
        n = len(occurrences(state, tool.name)) + 1
        while _auto_id(tool.name, n) in self.used or _auto_id(tool.name, n) in state.steps:
            n += 1
        return self._use(_auto_id(tool.name, n))

    def _fingerprint(self, step_id: str, tool: Tool, arguments: Mapping[str, Any]) -> str:
        wf = self.workflow
        return wf.ledger.events.fingerprint(wf.workflow_id, step_id, tool, arguments)

    def _use(self, step_id: str) -> str:
        self.used.add(step_id)
        return step_id

    async def call(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        fn: Callable[[dict[str, Any], str], Any] | None = None,
        *,
        call_id: str | None = None,
    ) -> Any:
        """Run one tool call as a step, after the calls before it in its model turn.

        Raises ToolFailure for the tool's own error (recorded as failed) and lets every
        other StepLedgerError through as it is.
        """
        self.turnstile.enter(call_id)
        try:
            async with self.lock:
                return await self._call(tool, dict(arguments), fn)
        finally:
            self.turnstile.leave(call_id)

    async def _call(
        self, tool: Tool, args: dict[str, Any], fn: Callable[[dict[str, Any], str], Any] | None
    ) -> Any:
        self.know([tool])
        marked, replayed = self._replay_marked(tool, args)
        if marked:
            return replayed
        step_id = self.step_id(tool, args)
        self._raise_recorded_failure(step_id, tool, args)
        run = fn or tool.run
        raised: list[BaseException] = []

        async def tracked(a: dict[str, Any], key: str) -> Any:
            try:
                assert run is not None
                if inspect.iscoroutinefunction(run):
                    return await run(a, key)
                # A blocking call (a service over HTTP) keeps off the event loop.
                result = await asyncio.to_thread(run, a, key)
                return await result if inspect.isawaitable(result) else result
            except Exception as exc:
                raised.append(exc)
                raise

        try:
            return await self.workflow.astep(step_id, tool, args, fn=tracked)
        except Exception as exc:
            self._tool_failure(step_id, exc, raised)
            raise

    def call_sync(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        fn: Callable[[dict[str, Any], str], Any] | None = None,
    ) -> Any:
        """Run one tool call as a step from synchronous code (one at a time per run)."""
        with self.sync_lock:
            args = dict(arguments)
            self.know([tool])
            marked, replayed = self._replay_marked(tool, args)
            if marked:
                return replayed
            step_id = self.step_id(tool, args)
            self._raise_recorded_failure(step_id, tool, args)
            raised: list[BaseException] = []
            run = fn or tool.run
            assert run is not None

            def tracked(a: dict[str, Any], key: str) -> Any:
                try:
                    result = run(a, key)
                    return _finish(result) if inspect.isawaitable(result) else result
                except Exception as exc:
                    raised.append(exc)
                    raise

            try:
                return self.workflow.step(step_id, tool, args, fn=tracked)
            except Exception as exc:
                self._tool_failure(step_id, exc, raised)
                raise

    def model_turn_sync(
        self, request: Any, ask: Callable[[], Asked], calls: Calls | None = None
    ) -> Turn:
        """The model's answer to one request from synchronous code (see :meth:`model_turn`)."""
        return self.turns.turn(request, ask, calls)

    def _replay_marked(self, tool: Tool, args: dict[str, Any]) -> tuple[bool, Any]:
        """(True, the recorded result) for a call of a replayed turn whose secrets are marks.

        Such a call is its tool's next settled step this run has not used (the turn was
        replayed only because that step exists), replayed without calling anything: the
        tool never receives a mark in place of a value.  (False, None) for any other call.
        """
        step_id = self.turns.secrets.replayed_step(tool, args, self.used)
        if step_id is None:
            return False, None
        wf = self.workflow
        if not step_id:
            raise StepLedgerError(
                f"tool {tool.name!r}: a replayed model turn asks for a call whose secret "
                "arguments the log holds only as marks, and no settled step of it is left to "
                "replay; the tool is not called",
                workflow_id=wf.workflow_id,
                tool=tool.name,
            )
        step = wf.state.steps[self._use(step_id)]
        if step.status is StepStatus.FAILED:
            raise ToolFailure(ToolCallError(f"{step.error}", step_id=step_id), step_id)
        return True, recorded_result(tool, step)

    def _raise_recorded_failure(self, step_id: str, tool: Tool, args: dict[str, Any]) -> None:
        known = self.workflow.state.steps.get(step_id)
        if known is None or known.status is not StepStatus.FAILED:
            return
        # Only the recorded call is told its recorded failure: another is a mismatch.
        wf = self.workflow
        shown, fp = wf.ledger.events.recorded_arguments(wf.workflow_id, step_id, tool, args)
        problem = mismatch(
            wf.state,
            step_id,
            tool.name,
            fp,
            known.sequence,
            legacy=lambda: tool.legacy_digest(args),
            shown=lambda: shown,
        )
        if problem is not None:
            raise PlanMismatchError(problem, workflow_id=wf.workflow_id, step_id=step_id)
        # The model saw this failure in the run that recorded it: it sees it again.
        raise ToolFailure(ToolCallError(f"{known.error}", step_id=step_id), step_id)

    def _tool_failure(self, step_id: str, exc: Exception, raised: list[BaseException]) -> None:
        """Raise ToolFailure when ``exc`` is the tool's own error, recorded as failed."""
        state = self.workflow.state.steps.get(step_id)
        failed = state is not None and state.status is StepStatus.FAILED
        if raised and exc is raised[-1] and failed:
            raise ToolFailure(exc, step_id) from exc

    def know(self, tools: Iterable[Tool]) -> None:
        """Tools this run may call, beside the ledger's (see :attr:`records_model`)."""
        for tool in tools:
            if tool.name == MODEL_TOOL and tool is not self.model:
                raise ToolDefinitionError(
                    f"a tool may not be named {MODEL_TOOL!r}: model turns are recorded under it",
                    tool=tool.name,
                )
            self._known[tool.name] = tool

    def tools(self) -> dict[str, Tool]:
        """The tools this run may call, by name (the ledger's and the framework's)."""
        return {**{t.name: t for t in self.workflow.ledger.tools}, **self._known}

    async def model_turn(
        self, request: Any, ask: Callable[[], Awaitable[Asked]], calls: Calls | None = None
    ) -> Turn:
        """The model's answer to one request: the recorded one, or asked and recorded.

        ``request`` is what the request says (JSON-like, without what the framework makes
        up per run); ``ask`` asks the model and returns its response as JSON with its usage;
        ``calls`` gives the tool calls of a response (their secrets are recorded as marks).
        Raises BudgetExceededError, before asking, when the workflow spent its budget.
        """
        return await self.turns.aturn(request, ask, calls)


def outside_the_ledger(names: Iterable[str], why: str, *, strict: bool) -> None:
    """Warn about framework tools whose calls are not stepledger steps; refuse them if strict.

    ``why`` says what a resume does with them.  Raises ToolDefinitionError when ``strict``.
    """
    found = sorted(set(names))
    if not found:
        return
    message = (
        f"framework tool(s) {', '.join(map(repr, found))} are not stepledger steps: {why}; "
        "make each an sl.Tool through the integration, or run with strict=True to refuse them"
    )
    if strict:
        raise ToolDefinitionError(message.replace(", or run with strict=True to refuse them", ""))
    warnings.warn(message, UnrecordedToolWarning, stacklevel=3)


def agent_steps(
    workflow: Workflow, *, record_model: bool = True, spending: Spending | None = None
) -> AgentSteps:
    """The step namer and runner of one run on ``workflow`` (each integration's ``steps_for``)."""
    return AgentSteps(workflow, model=model_tool() if record_model else None, spending=spending)


def _auto_id(tool: str, occurrence: int) -> str:
    return f"{tool}{AUTO_STEP_ID_SEPARATOR}{occurrence}"


def _finish(pending: Awaitable[Any]) -> Any:
    """An async tool's result, from synchronous code (a graph node runs in its own thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(pending))
    raise ToolDefinitionError(
        "an async tool was called from synchronous code inside an event loop: run the graph "
        "with its async API or make the tool synchronous"
    )


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending


_CURRENT: contextvars.ContextVar[AgentSteps | None] = contextvars.ContextVar(
    "stepledger_agent_steps", default=None
)


def current() -> AgentSteps:
    """The steps of the run under way (set by an integration's ``run``)."""
    steps = _CURRENT.get()
    if steps is None:
        raise StepLedgerError(
            "no stepledger workflow is running: start the agent with the integration's "
            "run(agent, prompt, workflow)"
        )
    return steps


def bind(steps: AgentSteps) -> contextvars.Token[AgentSteps | None]:
    """Make ``steps`` the current run's steps (tasks started from here inherit them)."""
    return _CURRENT.set(steps)


def unbind(token: contextvars.Token[AgentSteps | None]) -> None:
    """Undo :func:`bind`."""
    _CURRENT.reset(token)


def tool_steps(summaries: Iterable[StepSummary], model: str = MODEL_TOOL) -> list[StepSummary]:
    """The summaries of tool steps (model turns left out), in log order."""
    return [s for s in summaries if s.tool != model]


def is_model_step(step: StepState, model: str = MODEL_TOOL) -> bool:
    """True for a recorded model turn."""
    return step.tool == model


def replayed_steps(workflow: Workflow) -> tuple[list[StepState], list[str]]:
    """The succeeded tool steps a rebuilt conversation shows, and a note for every other one.

    Model turns are left out (the conversation is rebuilt from the tool steps); a step that
    did not succeed is told to the model as a note, so it knows what is still open.
    """
    done: list[StepState] = []
    notes: list[str] = []
    for step in workflow.state.ordered_steps():
        if is_model_step(step):
            continue
        if step.status is not StepStatus.SUCCEEDED:
            notes.append(f"{step.step_id} ({step.tool}): {step.status.value} {step.error or ''}")
            continue
        done.append(step)
    return done, notes

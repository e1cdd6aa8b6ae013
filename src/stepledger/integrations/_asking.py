"""A run's model turns: each one replayed from the log or asked and recorded, in one place.

A turn is a read-only step (tool ``model``) whose argument is the request's digest
(:func:`~stepledger.integrations._turns.request_digest`, declared volatile parts and known
secrets left out) and whose result is the response with its usage
(:mod:`stepledger.integrations._turns`).  The model is asked again exactly when:

- no turn of this workflow has the request's digest, or every one that has was used by
  this run already (a prompt that changed, a volatile part that was not declared);
- recording is off (``record_model=False``);
- the recorded turn carried secrets for a call that has no settled step to replay
  (:mod:`stepledger.integrations._turn_secrets`);
- the recorded turn's step is not settled (its intent is in doubt: the model was asked,
  the answer never recorded).

Before it is asked, the workflow's budget is checked and the turn reserved on the fleet's
budget topic (settled with its usage after); a replay is never refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic_core import to_jsonable_python

from stepledger.domain.state import StepStatus
from stepledger.domain.tools import Tool
from stepledger.domain.usage import SECRET_CALLS_KEY as SECRET_CALLS
from stepledger.domain.usage import TurnUsage, recorded, unrecorded
from stepledger.integrations._turn_secrets import Calls, TurnSecrets
from stepledger.integrations._turns import Asked, Spending, Turn, TurnCosts, request_digest

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from stepledger.producer.ledger import Workflow


class RunSteps(Protocol):
    """What the turns of a run use of its steps (``_core.AgentSteps`` is the one kind)."""

    workflow: Workflow
    model: Tool | None
    """The model's read-only tool (None: turns are not recorded)."""
    lock: asyncio.Lock
    sync_lock: threading.Lock
    used: set[str]
    """The step ids this run has matched so far."""

    def step_id(self, tool: Tool, arguments: Mapping[str, Any]) -> str:
        """The id of the next step of ``tool`` with these arguments."""
        ...

    def tools(self) -> dict[str, Tool]:
        """The run's tools by name."""
        ...


class ModelTurns:
    """Asks or replays the model turns of one run (the integrations' ``model_turn``)."""

    def __init__(self, steps: RunSteps, spending: Spending) -> None:
        self.steps = steps
        self.costs = TurnCosts(steps.workflow, spending, recording=steps.model is not None)
        """Digest, price, budget and reuse marks of the run's turns."""
        self.secrets = TurnSecrets(steps.workflow)
        """The secrets the run's turns carried, and their marks."""

    def digest(self, request: Any) -> str:
        """The digest a turn is recorded under: no volatile part, every known secret marked."""
        said = to_jsonable_python(request, fallback=repr)  # framework objects as JSON first
        return request_digest(self.secrets.scrub(self.costs.request(said)))

    async def aturn(
        self, request: Any, ask: Callable[[], Awaitable[Asked]], calls: Calls | None
    ) -> Turn:
        """The model's answer to one request on an event loop (see the module doc)."""
        steps = self.steps
        fresh: list[Turn] = []
        if steps.model is None:
            self.costs.before_asking(None)
            held = await steps.workflow.ledger.off_loop(self.costs.reserve, None)
            fresh.append(self._asked(*(await ask())))  # failed: the estimate stands
            await steps.workflow.ledger.off_loop(self.costs.settle, held, fresh)
            return fresh[0]
        tool, args = steps.model, {"request": self.digest(request)}

        async def asking(_: dict[str, Any], __: str) -> Any:
            return self._record(await ask(), calls, fresh)

        async with steps.lock:
            step_id = self._step(tool, args)
            self.costs.before_asking(step_id)
            held = await steps.workflow.ledger.off_loop(self.costs.reserve, step_id)
            try:
                result = await steps.workflow.astep(step_id, tool, args, fn=asking)
            finally:
                if fresh or held is None or _replayed(steps, step_id):
                    await steps.workflow.ledger.off_loop(self.costs.settle, held, fresh)
            if not fresh:
                await steps.workflow.arecord(self.costs.reuse(step_id))
        return fresh[0] if fresh else self._turn(result)

    def turn(self, request: Any, ask: Callable[[], Asked], calls: Calls | None) -> Turn:
        """The model's answer to one request from synchronous code (one at a time per run)."""
        steps = self.steps
        fresh: list[Turn] = []
        if steps.model is None:
            self.costs.before_asking(None)
            held = self.costs.reserve(None)
            fresh.append(self._asked(*ask()))  # failed: the estimate stands
            self.costs.settle(held, fresh)
            return fresh[0]
        tool, args = steps.model, {"request": self.digest(request)}

        def asking(_a: dict[str, Any], _k: str) -> Any:
            return self._record(ask(), calls, fresh)

        with steps.sync_lock:
            step_id = self._step(tool, args)
            self.costs.before_asking(step_id)
            held = self.costs.reserve(step_id)
            try:
                result = steps.workflow.step(step_id, tool, args, fn=asking)
            finally:
                if fresh or held is None or _replayed(steps, step_id):
                    self.costs.settle(held, fresh)
            if not fresh:
                steps.workflow.record(self.costs.reuse(step_id))
        return fresh[0] if fresh else self._turn(result)

    def _step(self, tool: Tool, args: dict[str, Any]) -> str:
        """The turn's step: a recorded one it may replay, or a new one (the model is asked)."""
        steps = self.steps
        state = steps.workflow.state
        # Each pass uses one recorded turn of this digest up: bounded by the steps recorded.
        for _ in range(len(state.steps) + 1):
            step_id = steps.step_id(tool, args)
            known = state.steps.get(step_id)
            if known is None or known.status is not StepStatus.SUCCEEDED:
                return step_id
            turn = _parsed(known.result_json)
            if self.secrets.replayable(turn, steps.used):
                return step_id
        return steps.step_id(tool, args)

    def _record(self, answer: Asked, calls: Calls | None, fresh: list[Turn]) -> Any:
        """A turn just asked, as its step's result: secrets marked, usage priced.

        The run goes on with the response as the model gave it (``fresh``): only the log
        holds marks in place of secrets.
        """
        response, usage = answer
        priced = self.costs.priced(usage)
        fresh.append(Turn(response, priced, reused=False))
        self.costs.asked(priced)
        hidden, secret_calls = self.secrets.hide(response, calls, self.steps.tools())
        result = recorded(hidden, priced)
        if secret_calls:
            result[SECRET_CALLS] = secret_calls
        return result

    def _asked(self, response: Any, usage: TurnUsage | None) -> Turn:
        priced = self.costs.priced(usage)
        self.costs.asked(priced)
        return Turn(response, priced, reused=False)

    @staticmethod
    def _turn(result: Any) -> Turn:
        response, usage = unrecorded(result)
        return Turn(response, usage, reused=True)


def _replayed(steps: RunSteps, step_id: str) -> bool:
    """True when the turn's step holds a recorded answer (it replayed: nothing was asked)."""
    known = steps.workflow.state.steps.get(step_id)
    return known is not None and known.status is StepStatus.SUCCEEDED


def _parsed(result_json: str | None) -> Any:
    try:
        return json.loads(result_json) if result_json else None
    except ValueError:
        return None

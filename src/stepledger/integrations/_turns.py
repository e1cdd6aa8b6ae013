"""A model turn's cost: its digest without volatile parts, its usage, its budget, its reuse.

One mechanism for every integration.  A turn is a read-only step (tool ``model``) whose
argument is the request's digest and whose result is the framework's response with the
turn's usage beside it (:func:`stepledger.domain.usage.recorded`):

- the digest is the one canonical request digest (:func:`stepledger.integrations._core.
  request_digest`) of the request with the declared volatile parts cut out
  (:class:`~stepledger.domain.usage.Volatile`), so a prompt that carries the time replays;
- a turn asked is priced by the operator's table and its usage recorded with it; a turn
  replayed reports the usage it was recorded with and appends ``model_turn_reused``, so
  the log says what was spent and what a resume did not spend again (the projection's
  ``model_calls``);
- before the model is asked, the workflow's recorded turns are summed against its
  :class:`~stepledger.domain.usage.Budget`; a replay is never refused (it spends nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python

from stepledger import tracing
from stepledger.domain import events as ev
from stepledger.domain import fingerprint
from stepledger.domain.fleetbudget import FleetBudget
from stepledger.domain.state import StepStatus
from stepledger.domain.usage import Budget, PriceTable, TurnUsage, Volatile, usage_of
from stepledger.errors import BudgetExceededError, ToolDefinitionError
from stepledger.wire import MODEL_STEP_TOOL

if TYPE_CHECKING:
    from stepledger.producer.fleetbudget import Held
    from stepledger.producer.workflow import Workflow

_VOLATILE = frozenset({"id", "timestamp", "created_at", "provider_response_id", "run_id"})
"""Keys left out of a request's digest: the framework makes them up anew on every run."""

Asked = tuple[Any, TurnUsage | None]
"""What an integration's ``ask`` returns: the response as JSON, and its usage if reported."""


def request_digest(*parts: Any) -> str:
    """A digest of a model request that ignores what a framework regenerates per run.

    The canonical digest call fingerprints use (:func:`stepledger.domain.fingerprint.of_value`)
    of the request without the keys in ``_VOLATILE``.
    """
    return fingerprint.of_value(_stable(to_jsonable_python(list(parts), fallback=repr)))


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Turn:
    """A model turn as the integration hands it back to its framework."""

    response: Any
    """The response as JSON (recorded, or just asked)."""
    usage: TurnUsage | None
    """What the turn cost when it was asked (None: the framework reported nothing)."""
    reused: bool
    """True when replayed from the log: nothing was spent on it this time."""


@dataclass(frozen=True, slots=True)
class Spending:
    """How a run's model turns are matched, priced and limited (all optional)."""

    volatile: Volatile | None = None
    """Parts of a request left out of its digest."""
    prices: PriceTable | None = None
    """The operator's prices; without them a turn's cost is None."""
    budget: Budget | None = None
    """What the workflow may spend on model calls over all its runs."""
    fleet_budget: FleetBudget | None = None
    """What the fleet may spend on model calls, over all its workflows (its budget topic)."""


class TurnCosts:
    """The cost side of one run's model turns (digest, price, budget, reuse marks)."""

    def __init__(self, workflow: Workflow, spending: Spending, *, recording: bool) -> None:
        if spending.budget is not None and not recording:
            raise ToolDefinitionError(
                "a model budget counts the turns the log recorded: it needs record_model=True"
            )
        self.workflow = workflow
        self.spending = spending
        self._usage: dict[str, TurnUsage | None] = {}

    def request(self, request: Any) -> Any:
        """The request without its declared volatile parts (what its digest is taken of)."""
        volatile = self.spending.volatile
        return request if volatile is None else volatile.strip(request)

    def priced(self, usage: TurnUsage | None) -> TurnUsage | None:
        """The usage with its cost by the price table (as reported without one)."""
        prices = self.spending.prices
        return usage if usage is None or prices is None else prices.priced(usage)

    def spent(self) -> tuple[int, float]:
        """Tokens and cost of every turn the workflow's log recorded (all its runs)."""
        tokens, cost = 0, 0.0
        for step in list(self.workflow.state.steps.values()):
            if step.tool != MODEL_STEP_TOOL or step.status is not StepStatus.SUCCEEDED:
                continue
            if step.step_id not in self._usage:
                self._usage[step.step_id] = usage_of(step.result_json)
            usage = self._usage[step.step_id]
            if usage is not None:
                tokens += usage.tokens
                cost += usage.cost or 0.0
        return tokens, cost

    def before_asking(self, step_id: str | None) -> None:
        """Raise BudgetExceededError when the turn would ask the model past the budget.

        ``step_id`` is the turn's step (None: turns are not recorded); a step the log
        settled replays and is never refused.
        """
        budget = self.spending.budget
        if budget is None:
            return
        known = self.workflow.state.steps.get(step_id) if step_id else None
        if known is not None and known.status is StepStatus.SUCCEEDED:
            return
        tokens, cost = self.spent()
        why = budget.refusal(tokens, cost)
        if why is None:
            return
        wf = self.workflow
        raise BudgetExceededError(
            f"workflow {wf.workflow_id!r} {why}: the model is not asked again; raise its "
            "budget (Budget in the integration's steps_for) and resume it",
            workflow_id=wf.workflow_id,
            spent_tokens=tokens,
            spent_cost=cost,
            limit=why,
        )

    def reserve(self, step_id: str | None) -> Held | None:
        """Reserve the turn on the fleet's budget topic before the model is asked.

        Raises BudgetExceededError when the topic's order refuses it, the broker's error
        when the topic cannot be written or read back (the model is not asked either way);
        a step the log settled replays and reserves nothing.
        """
        budget = self.spending.fleet_budget
        if budget is None:
            return None
        wf = self.workflow
        known = wf.state.steps.get(step_id) if step_id else None
        if known is not None and known.status is StepStatus.SUCCEEDED:
            return None
        return wf.ledger.fleet_budgets.reserve(budget, wf.workflow_id, step_id, wf.runner)

    def settle(self, held: Held | None, fresh: list[Turn]) -> None:
        """Settle a reservation with what its turn spent (nothing asked: nothing spent).

        A turn asked without reported usage keeps its estimate.
        """
        if held is None:
            return
        if not fresh:
            self.workflow.ledger.fleet_budgets.settle(held, 0, 0.0)
        elif fresh[0].usage is not None:
            usage = fresh[0].usage
            self.workflow.ledger.fleet_budgets.settle(held, usage.tokens, usage.cost or 0.0)

    def asked(self, usage: TurnUsage | None) -> None:
        """Note a turn asked now (its step span, if traced, gets its usage)."""
        tracing.model_usage(usage, replayed=False)

    def reuse(self, step_id: str) -> ev.Event:
        """The event that marks a recorded turn replayed by this run."""
        wf = self.workflow
        body = ev.ModelTurnReused(attempt=wf.attempt, runner=wf.runner)
        return wf.ledger.events.envelope(wf.workflow_id, step_id, body)

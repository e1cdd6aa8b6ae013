"""A fleet's model budget: reservations decided by one log's order, settled by actual usage.

Pure.  A fleet's workflows sit in many partitions of the step log, so their spends have no
order there; the fleet's budget topic (one partition, keyed by fleet) gives them one.  Before
a turn asks a model, its runner appends a ``budget_reserved`` (the configured estimate of one
turn, and the limits it applies), reads the partition back through its own record and folds
it here: a reservation is **granted** when, at its place in the log, what the fleet has
committed plus its estimate fits the limits it carries (raised by every ``budget_raised``
before it); else it is **refused** and the model is not asked.  After the turn the runner
appends ``budget_settled`` with what the turn spent, which replaces the estimate.

Every reader folds the same records in the same order, so every reader decides every
reservation the same way: the log decides.  Committed spend counts a granted reservation at
its estimate until it is settled, then at its actual usage; a refused reservation counts
nothing.  The bound (docs/frameworks.md): the fleet's spend exceeds its budget by at most the
overruns (actual beyond estimate) of the turns in flight when the last reservation was
granted, one per concurrent turn; with an estimate no turn exceeds, never.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from stepledger.domain import events as ev


class FleetBudget(BaseModel):
    """What a fleet may spend on model calls, over all its workflows (None: no limit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: int | None = Field(default=None, ge=0)
    """Input and output tokens of every turn of the fleet."""
    cost: float | None = Field(default=None, ge=0)
    """Cost by the price table (a turn without a price adds nothing)."""
    per_turn_tokens: int = Field(gt=0)
    """The tokens one turn is reserved (an estimate: the prompt and ``max_tokens``)."""
    per_turn_cost: float = Field(default=0.0, ge=0)
    """The cost one turn is reserved."""
    wait_s: float = Field(default=0.0, ge=0, le=86_400)
    """How long a refused turn waits for a person to raise the budget (``stepledger budget
    raise``, an answer on the budget topic) before BudgetExceededError; 0: refuse at once."""


@dataclass(slots=True)
class _Reservation:
    tokens: int
    cost: float
    settled: bool = False


@dataclass(slots=True)
class FleetSpend:
    """One fleet's budget topic folded in order: what is committed, what was decided."""

    fleet_id: str
    tokens: int = 0
    """Tokens committed: granted turns at actual usage once settled, at estimate before."""
    cost: float = 0.0
    """Cost committed, the same way."""
    raised_tokens: int = 0
    """Tokens added to every limit by raises so far."""
    raised_cost: float = 0.0
    """Cost added to every limit by raises so far."""
    granted: dict[str, _Reservation] = field(default_factory=dict)
    """Granted reservations by event id."""
    refused: set[str] = field(default_factory=set)
    """Refused reservations' event ids."""

    def apply(self, event: ev.Event) -> None:
        """Fold one record of the budget topic (another fleet's records change nothing)."""
        body = event.body
        if event.fleet_id != self.fleet_id:
            return
        if isinstance(body, ev.BudgetReserved):
            self._reserve(event.event_id, body)
        elif isinstance(body, ev.BudgetSettled):
            self._settle(body)
        elif isinstance(body, ev.BudgetRaised):
            self.raised_tokens += body.tokens
            self.raised_cost += body.cost

    def apply_all(self, events: Iterable[ev.Event]) -> None:
        """Fold records in log order."""
        for event in events:
            self.apply(event)

    def decision(self, reservation_id: str) -> bool | None:
        """True: granted; False: refused; None: not folded yet."""
        if reservation_id in self.granted:
            return True
        return False if reservation_id in self.refused else None

    def refusal(self, tokens: int, cost: float, budget: FleetBudget) -> str | None:
        """Why a reservation of this much would be refused now, or None if it fits."""
        if budget.tokens is not None:
            limit = budget.tokens + self.raised_tokens
            if self.tokens + tokens > limit:
                return f"committed {self.tokens} of its {limit} tokens"
        if budget.cost is not None:
            limit_cost = budget.cost + self.raised_cost
            if self.cost + cost > limit_cost:
                return f"committed {self.cost:.6g} of its {limit_cost:.6g} cost"
        return None

    def _reserve(self, event_id: str, body: ev.BudgetReserved) -> None:
        if event_id in self.granted or event_id in self.refused:
            return  # a duplicate of a record already decided (a retried produce)
        carried = FleetBudget(
            tokens=body.limit_tokens,
            cost=body.limit_cost,
            per_turn_tokens=max(1, body.tokens),
            per_turn_cost=body.cost,
        )
        if self.refusal(body.tokens, body.cost, carried) is not None:
            self.refused.add(event_id)
            return
        self.granted[event_id] = _Reservation(body.tokens, body.cost)
        self.tokens += body.tokens
        self.cost += body.cost

    def _settle(self, body: ev.BudgetSettled) -> None:
        held = self.granted.get(body.reservation)
        if held is None or held.settled:
            return  # a refused reservation spent nothing; a duplicate settles nothing more
        self.tokens += body.tokens - held.tokens
        self.cost += body.cost - held.cost
        held.tokens, held.cost, held.settled = body.tokens, body.cost, True

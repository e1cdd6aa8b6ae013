"""Framework integrations: Pydantic AI, the OpenAI Agents SDK and LangGraph on stepledger.

Each module imports its framework when it is imported (``pip install
'stepledger[openai-agents]'`` and so on); this package imports none.  The pieces they share
(step ids a model cannot change, model turns as steps, a deterministic order for parallel
tool calls) are in :mod:`stepledger.integrations._core`; what a model turn costs (usage,
prices, budget, volatile parts of a request) in :mod:`stepledger.integrations._turns`.
"""

from __future__ import annotations

from stepledger.domain.fleetbudget import FleetBudget
from stepledger.domain.usage import Budget, PriceTable, TurnUsage, Volatile, price_table
from stepledger.integrations._turns import Spending, Turn

__all__ = [
    "Budget",
    "FleetBudget",
    "PriceTable",
    "Spending",
    "Turn",
    "TurnUsage",
    "Volatile",
    "price_table",
]

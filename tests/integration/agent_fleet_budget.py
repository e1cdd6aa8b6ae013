"""One process of a fleet racing for its model budget's last tokens (run by a test).

argv: settings as JSON, the process name, its runners, the tokens each turn spends, a file
whose existence says "go".  Prints one JSON line: the tokens of every turn this process
asked, and how many of its runners were refused.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stepledger.config import Settings
from stepledger.domain.fleetbudget import FleetBudget
from stepledger.domain.usage import TurnUsage
from stepledger.errors import BudgetExceededError
from stepledger.integrations import Spending
from stepledger.integrations._core import agent_steps
from stepledger.producer.ledger import Ledger

BUDGET = FleetBudget(tokens=1_000, per_turn_tokens=300)


def main() -> None:
    raw, name, runners, spent, go = sys.argv[1:6]
    settings = Settings.model_validate_json(raw).model_copy(update={"producer_id": name})
    ledger = Ledger(settings)
    asked: list[int] = []
    refused: list[str] = []
    lock = threading.Lock()
    workflows = [ledger.workflow(f"{name}-{n}") for n in range(int(runners))]
    ledger.fleet_budgets.spend  # noqa: B018 (the book is made before the race)
    deadline = time.monotonic() + 30
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.005)

    def run(n: int) -> None:
        steps = agent_steps(workflows[n], spending=Spending(fleet_budget=BUDGET))
        for turn in range(10):

            def ask(turn: int = turn) -> tuple[Any, TurnUsage]:
                with lock:
                    asked.append(int(spent))
                return {"text": f"{name}/{n}/{turn}"}, TurnUsage(input_tokens=int(spent))

            try:
                steps.model_turn_sync({"runner": n, "turn": turn}, ask)
            except BudgetExceededError as exc:
                with lock:
                    refused.append(exc.message)
                return

    threads = [threading.Thread(target=run, args=(n,)) for n in range(int(runners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    print(json.dumps({"asked": asked, "refused": len(refused)}), flush=True)
    ledger.close()


if __name__ == "__main__":
    main()

"""Two processes of one fleet race for its model budget's last tokens on a real broker.

Each turn reserves 300 tokens (the fleet's estimate) and spends 350: the budget topic's order
lets the fleet cross its 1,000 tokens by at most 50 per concurrent runner, and every
reservation the processes acted on is the one the log decided.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from stepledger.config import Settings
from stepledger.domain.fleetbudget import FleetSpend
from stepledger.domain.usage import TurnUsage
from stepledger.integrations import FleetBudget, Spending, Turn
from stepledger.integrations._core import agent_steps
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import ensure_budget_topic
from stepledger.log import codec_for
from stepledger.producer.ledger import Ledger

AGENT = Path(__file__).with_name("agent_fleet_budget.py")
RUNNERS = 2
ESTIMATE, SPENT, LIMIT = 300, 350, 1_000


def _argv(go: Path) -> list[str]:
    return [str(RUNNERS), str(SPENT), str(go)]


def test_two_processes_racing_cross_the_fleet_budget_by_at_most_one_overrun_per_runner(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    assert ensure_budget_topic(settings, settings.budget_topic) == 1
    go = tmp_path / "go"
    agents = [
        subprocess.Popen(
            [sys.executable, str(AGENT), settings.model_dump_json(), name, *_argv(go)],
            env=src_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p1", "p2")
    ]
    go.touch()
    outputs = [agent.communicate(timeout=60) for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), [err[-2000:] for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    asked = [tokens for result in results for tokens in result["asked"]]

    assert sum(r["refused"] for r in results) == 2 * RUNNERS  # every runner stopped by it
    assert LIMIT - ESTIMATE < sum(asked) <= LIMIT + 2 * RUNNERS * (SPENT - ESTIMATE)

    # An independent reader folds the topic: it decided exactly the turns that were asked.
    spend = FleetSpend(settings.fleet_id)
    for record in read_topic(settings, codec_for(settings), topic=settings.budget_topic):
        assert record.event is not None
        spend.apply(record.event)
    assert len(spend.granted) == len(asked) and len(spend.refused) == 2 * RUNNERS
    assert spend.tokens == sum(asked)


def test_a_person_raises_the_budget_from_the_command_line_and_the_waiting_runner_goes_on(
    settings: Settings, src_env: dict[str, str]
) -> None:
    ensure_budget_topic(settings, settings.budget_topic)
    budget = FleetBudget(tokens=LIMIT, per_turn_tokens=ESTIMATE, wait_s=30)
    answer = ({"text": "hi"}, TurnUsage(input_tokens=ESTIMATE))
    done: list[Turn] = []
    with Ledger(settings) as ledger:
        steps = agent_steps(ledger.workflow("waits"), spending=Spending(fleet_budget=budget))
        for n in range(3):
            steps.model_turn_sync({"n": n}, lambda: answer)
        waiting = threading.Thread(
            target=lambda: done.append(steps.model_turn_sync({"n": 3}, lambda: answer))
        )
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive() and not done  # refused: waits for a person
        where = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
        where += ["--fleet", settings.fleet_id]
        cli = [sys.executable, "-m", "stepledger", "budget"]
        raised = subprocess.run(
            [*cli, "raise", "--tokens", "500", "--by", "ana", "--note", "demo", *where],
            env=src_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert raised.returncode == 0, raised.stderr[-2000:]
        assert "raised by ana" in raised.stdout
        waiting.join(30)
        assert done and not done[0].reused  # the model was asked after the raise
    shown = subprocess.run(
        [*cli, "show", *where], env=src_env, capture_output=True, text=True, timeout=60
    )
    assert f"committed {4 * ESTIMATE} tokens" in shown.stdout, shown.stderr[-2000:]
    assert "raised by 500 tokens" in shown.stdout and "1 refused" in shown.stdout

"""Two processes of one fleet race for its model budget's last tokens on a real broker.

Each turn reserves 300 tokens (the fleet's estimate) and spends 350: the budget topic's order
lets the fleet cross its 1,000 tokens by at most 50 per concurrent runner, and every
reservation the processes acted on is the one the log decided.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepledger.config import Settings
from stepledger.domain.fleetbudget import FleetSpend
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import ensure_budget_topic
from stepledger.log import codec_for

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

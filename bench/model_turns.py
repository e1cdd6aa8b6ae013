"""What recording a model turn costs: latency and client CPU per turn, asked and replayed.

One agent, sequential turns through ``AgentSteps.model_turn_sync`` (what every integration
calls) with an offline model that answers at once with a ~2 KB response and its usage:

- a turn asked and recorded (intent, the model, outcome with the usage beside the response);
- the same turn replayed by a resume (read from the log, one ``model_turn_reused`` record);
- recording off (``record_model=False``): the model alone, the floor.

A real model answers in hundreds of milliseconds to seconds: the recording's share is the
first row against that.  ``python -m bench.model_turns [--quick] [--bootstrap HOST:PORT]``
(or ``python -m bench --only model_turns``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from bench.common import Row, broker, fresh_settings, percentile, table
from stepledger.config import Settings
from stepledger.domain.usage import TurnUsage
from stepledger.integrations._core import agent_steps
from stepledger.producer import Ledger

TURNS_PER_WORKFLOW = 10
RESPONSE = {"output": [{"type": "message", "content": [{"text": "x" * 2000}]}]}
USAGE = TurnUsage(model="bench", input_tokens=1200, output_tokens=300, cached_tokens=800)


def _ask() -> tuple[Any, TurnUsage | None]:
    return RESPONSE, USAGE


def turn_costs(settings: Settings, turns: int, *, record: bool) -> dict[str, list[float]]:
    """Seconds and CPU seconds per turn, asked then replayed (replays only when recording)."""
    found: dict[str, list[float]] = {"asked": [], "asked_cpu": [], "replayed": [], "cpu": []}
    with Ledger(settings) as ledger:
        ids = [f"wf-{uuid.uuid4().hex[:10]}" for _ in range(max(1, turns // TURNS_PER_WORKFLOW))]
        for workflow_id in ids:
            steps = agent_steps(ledger.workflow(workflow_id), record_model=record)
            for i in range(TURNS_PER_WORKFLOW):
                began, cpu = time.perf_counter(), time.process_time()
                steps.model_turn_sync([["user", f"turn {i}"]], _ask)
                found["asked"].append(time.perf_counter() - began)
                found["asked_cpu"].append(time.process_time() - cpu)
        if not record:
            return found
    with Ledger(settings) as ledger:  # "another process" resuming every workflow
        for workflow_id in ids:
            steps = agent_steps(ledger.workflow(workflow_id))
            for i in range(TURNS_PER_WORKFLOW):
                began, cpu = time.perf_counter(), time.process_time()
                turn = steps.model_turn_sync([["user", f"turn {i}"]], _ask)
                found["replayed"].append(time.perf_counter() - began)
                found["cpu"].append(time.process_time() - cpu)
                assert turn.reused
    return found


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """p50 latency and median client CPU per model turn: recorded, replayed, not recorded."""
    turns = 50 if quick else 300
    rows: list[Row] = []
    with broker(bootstrap) as servers:
        turn_costs(fresh_settings(servers), 20, record=True)  # warm up
        on = turn_costs(fresh_settings(servers), turns, record=True)
        off = turn_costs(fresh_settings(servers), turns, record=False)
        for label, values in (
            ("turn p50, asked and recorded", on["asked"]),
            ("turn p50, replayed (reused)", on["replayed"]),
            ("turn p50, not recorded", off["asked"]),
            ("client CPU p50, asked and recorded", on["asked_cpu"]),
            ("client CPU p50, replayed", on["cpu"]),
        ):
            rows.append(Row("model_turns", label, percentile(values, 50) * 1000, None, "ms"))
    return rows


def main() -> None:
    """Print the figures as a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bootstrap")
    args = parser.parse_args()
    print(table(run(args.quick, args.bootstrap)))


if __name__ == "__main__":
    main()

"""What fencing costs a step: one agent, latency per step (intent, call, outcome).

- a keyed tool (safe to repeat), 20-step workflows: the first intent of each workflow is
  read back through its position, the next ones are proven by their offsets (each landed
  right after the runner's record before it);
- the same with ``ResumeOptions(pipeline_outcomes=True)`` (each outcome acknowledged with
  the next step's intent): the A/B of pipelined outcomes on a sequential step;
- an irreversible, unkeyed tool (a pivot: one per workflow): its intent is each workflow's
  first, so every step reads it back.  Only the step is timed, not the workflow's opening.

``python -m bench.fence [--quick] [--bootstrap HOST:PORT]`` (or ``python -m bench --only
fence``); run it against an older ``src/`` on ``PYTHONPATH`` for an A/B.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from bench.common import Row, broker, fresh_settings, percentile, table
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.producer import Ledger, ResumeOptions

KEYED = Tool(name="charge", effect="idempotent", keyed=True)
UNKEYED = Tool(name="email", effect="irreversible", policy="escalate")
PER_WORKFLOW = 20


def _done(args: dict[str, Any], key: str) -> str:
    return key


def step_latencies(
    settings: Settings, tool: Tool, steps: int, pipelined: bool = False
) -> list[float]:
    """Seconds per step (intent, call, outcome), sequentially through one Ledger."""
    found: list[float] = []
    per_workflow = PER_WORKFLOW if tool.repeatable else 1
    options = ResumeOptions(pipeline_outcomes=pipelined)
    with Ledger(settings, options=options) as ledger:
        while len(found) < steps:
            wf = ledger.workflow(f"wf-{uuid.uuid4().hex[:10]}")
            for i in range(per_workflow):
                began = time.perf_counter()
                wf.step(f"s{i}", tool, {"i": i}, _done)
                found.append(time.perf_counter() - began)
    return found[:steps]


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Per-step latency of a keyed tool (outcomes pipelined or not) and of an unkeyed tool
    (p50, p99)."""
    steps = 100 if quick else 500
    rows: list[Row] = []
    kinds = (
        ("keyed tool", KEYED, False),
        ("keyed tool, pipelined outcomes", KEYED, True),
        ("unkeyed tool (read-back)", UNKEYED, False),
    )
    with broker(bootstrap) as servers:
        step_latencies(fresh_settings(servers), KEYED, 40)  # warm up
        for label, tool, pipelined in kinds:
            found = step_latencies(fresh_settings(servers), tool, steps, pipelined)
            for q in (50, 99):
                value = percentile(found, q) * 1000
                rows.append(Row("fence", f"step p{q}, {label}", value, None, "ms"))
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

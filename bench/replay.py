"""Replaying a long workflow: the cost per replayed step must not grow with the workflow.

A workflow of N recorded steps (1k, 10k, 100k; quick: 1k, 10k) in an in-memory log is
opened by a new ``Ledger`` and its N steps are asked again: each returns its recorded
result without calling the tool.  Timed: the open (read + fold) plus the N replayed steps.
Target: 10,000 steps in under 0.5 s; the per-step cost at 100k within 2x of 1k (linear).

``python -m bench.replay [--quick]``
"""

from __future__ import annotations

import time
from collections.abc import Callable

import stepledger as sl
from bench.common import Row, cli
from stepledger.log import InMemoryEventLog


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """The bench's tool (never called while replaying)."""
    return i


def recorded(steps: int) -> InMemoryEventLog:
    """An in-memory log holding one unfinished workflow of ``steps`` steps."""
    log = InMemoryEventLog()
    with sl.Ledger(log=log, tools=[act]) as ledger:
        wf = ledger.start("long")
        for i in range(steps):
            wf.step(f"s{i}", act, i=i)
    return log


def replay_s(
    log: InMemoryEventLog, steps: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds to open the workflow and replay every recorded step, by ``clock``."""
    calls = 0

    def never(args: dict[str, object], key: str) -> int:
        nonlocal calls
        calls += 1
        return 0

    began = clock()
    with sl.Ledger(log=log, tools=[act]) as ledger:
        wf = ledger.workflow("long")
        for i in range(steps):
            assert wf.step(f"s{i}", act, {"i": i}, fn=never) == i, "not the recorded result"
    elapsed = clock() - began
    assert calls == 0, f"{calls} tools called while replaying"
    return elapsed


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """The replay curve; the bootstrap is unused (the log is in memory)."""
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    rows: list[Row] = []
    per_step: dict[int, float] = {}
    for steps in sizes:
        seconds = replay_s(recorded(steps), steps)
        per_step[steps] = seconds / steps * 1e6
        print(
            f"[replay] {steps:,} steps: {seconds:.3f} s, {per_step[steps]:.1f} us/step", flush=True
        )
        if steps == 10_000:
            rows.append(
                Row(
                    "replay",
                    "replay 10k recorded steps, in memory (vs 0.5 s)",
                    seconds,
                    0.5,
                    "s",
                    "<=1",
                    False,
                )
            )
    for steps in sizes[1:]:
        rows.append(
            Row(
                "replay",
                f"replay cost per step at {steps // 1000}k steps (vs 1k: linear is 1)",
                per_step[steps],
                per_step[sizes[0]],
                "us",
                "<=2",
                False,
            )
        )
    return rows


if __name__ == "__main__":
    cli(run, __doc__)

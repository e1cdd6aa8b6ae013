"""Replaying a workflow costs the same per step however long it is (it was quadratic).

Each replayed step's position check scanned every step of the workflow: 2,000 steps
replayed in 0.25 s, 8,000 in 4.5 s.  Timed as a ratio in one run, so the machine's load
cancels out: four times the steps must cost well under the sixteen times of a quadratic.
"""

from __future__ import annotations

import time

import stepledger as sl
from stepledger.log import InMemoryEventLog


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """A tool that is never called while replaying."""
    return i


def _recorded(steps: int) -> InMemoryEventLog:
    log = InMemoryEventLog()
    with sl.Ledger(log=log, tools=[act]) as ledger:
        wf = ledger.start("long")
        for i in range(steps):
            wf.step(f"s{i}", act, i=i)
    return log


def _replay_s(log: InMemoryEventLog, steps: int) -> float:
    def never(args: dict[str, object], key: str) -> int:
        raise AssertionError("a recorded step was called again")

    began = time.perf_counter()
    with sl.Ledger(log=log, tools=[act]) as ledger:
        wf = ledger.workflow("long")
        for i in range(steps):
            assert wf.step(f"s{i}", act, {"i": i}, fn=never) == i
    return time.perf_counter() - began


def test_replay_is_linear_in_the_steps() -> None:
    small, large = 1_500, 6_000
    small_log, large_log = _recorded(small), _recorded(large)
    small_s = min(_replay_s(small_log, small) for _ in range(3))
    large_s = min(_replay_s(large_log, large) for _ in range(2))
    assert large_s < 8 * small_s, (small_s, large_s)

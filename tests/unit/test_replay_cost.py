"""Replaying a workflow costs the same per step however long it is (it was quadratic).

Each replayed step's position check scanned every step of the workflow: 2,000 steps
replayed in 0.25 s, 8,000 in 4.5 s.  Timed as a ratio in one run, in the process's CPU
time (the tests run in two workers: wall time counted the other worker's bursts, 10.7x once),
the two sizes taken in turn so the machine's state cancels out: four times the steps must
cost well under the sixteen times of a quadratic.
"""

from __future__ import annotations

import time

from bench.replay import recorded, replay_s


def test_replay_is_linear_in_the_steps() -> None:
    small, large = 1_500, 6_000
    small_log, large_log = recorded(small), recorded(large)
    small_s, large_s = float("inf"), float("inf")
    for _ in range(3):
        small_s = min(small_s, replay_s(small_log, small, time.process_time))
        large_s = min(large_s, replay_s(large_log, large, time.process_time))
    assert large_s < 8 * small_s, (small_s, large_s)

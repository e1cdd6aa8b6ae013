"""Replaying a workflow costs the same per step however long it is (it was quadratic).

Each replayed step's position check scanned every step of the workflow: 2,000 steps
replayed in 0.25 s, 8,000 in 4.5 s.  Timed as a ratio in one run, so the machine's load
cancels out: four times the steps must cost well under the sixteen times of a quadratic.
"""

from __future__ import annotations

from bench.replay import recorded, replay_s


def test_replay_is_linear_in_the_steps() -> None:
    small, large = 1_500, 6_000
    small_log, large_log = recorded(small), recorded(large)
    small_s = min(replay_s(small_log, small) for _ in range(3))
    large_s = min(replay_s(large_log, large) for _ in range(2))
    assert large_s < 8 * small_s, (small_s, large_s)

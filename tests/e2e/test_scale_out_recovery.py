"""Scaling out under faults: 3 projectors and 2 recovery daemons on an 8-partition topic.

The run is ``stepledger chaos --projectors 3 --recoverers 2``: trip agents (real processes
of the SDK and the example tools) stream workflows and are SIGKILLed at crash points, after
their intent among them (steps left in doubt); meanwhile a projector is SIGKILLed and one
SIGSTOPped past its session timeout, a recovery daemon is SIGSTOPped past its session
timeout and SIGCONTed and another SIGKILLed, and one member of each group is added.  The
harness then checks, besides every chaos invariant: the union of the shards equals a
single-process rebuild table for table and row for row; each in-doubt step attempt was
decided by one recovery daemon process with one decision record, and no hook ran twice (the
example services' effect counts); each partition was replayed from offset 0 once per daemon
kind, when its shard or checkpoint did not exist yet (counted from the members' logs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_chaos import external, run_chaos

__all__ = ["external"]

SCALE_POINTS = {
    "projector:mid_batch",
    "consumer:sigstop_sigcont",
    "projector:added",
    "recovery:sigstop_sigcont",
    "recovery:mid_resolution",
    "recovery:added",
}


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_three_projectors_and_two_recovery_daemons_killed_stopped_and_added(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    args = ("--projectors", "3", "--recoverers", "2", "--workflows", "30", "--seed", "1")
    code, report, output = run_chaos(tmp_path, src_env, *external(*args, "--duration", "240"))
    assert code == 0, output
    assert report["passed"] and report["violations"] == [], report["violations"]
    counts = {row["point"]: row["count"] for row in report["crash_points"]}
    assert {p: counts.get(p, 0) for p in SCALE_POINTS} == dict.fromkeys(SCALE_POINTS, 1)
    assert counts.get("agent:after_intent", 0) >= 1, "no step was left in doubt"
    assert report["members"] == {"projector": 4, "recovery": 3}
    every = {str(p): 1 for p in range(8)}
    assert report["replays_from_zero"] == {"projector": every, "recovery": every}
    assert report["decided_by_daemons"] >= 1, "no in-doubt step reached a recovery daemon"
    assert "--projectors 3 --recoverers 2" in report["replay"]

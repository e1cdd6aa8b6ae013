"""The SDK's CPU-per-step bench runs with no broker: its fake producer acknowledges at once
and its fake reader serves the fence's read back (a workflow's first intent is read back
through its position, so a reader that asked a broker failed ``python -m bench --quick``)."""

from __future__ import annotations

from bench.producer import sdk_cpu_per_step


def test_the_sdk_cpu_bench_needs_no_broker() -> None:
    assert sdk_cpu_per_step(10, per_workflow=5) > 0

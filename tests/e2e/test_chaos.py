"""The chaos harness end to end: a short run passes, a broken build is caught by name."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CHAOS = [sys.executable, "-m", "stepledger", "chaos"]


@pytest.fixture
def external(engine: str, request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """Run on the session's broker unless it is Tansu (then chaos starts its own)."""
    bootstrap = None if engine == "tansu" else request.getfixturevalue("bootstrap")

    def args(*given: str) -> list[str]:
        return [*given, "--bootstrap", bootstrap] if bootstrap else list(given)

    return args


def run_chaos(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [*CHAOS, "--report", str(report), "--workdir", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return proc.returncode, json.loads(report.read_text()), proc.stdout + proc.stderr


@pytest.mark.e2e
def test_short_chaos_run_keeps_every_invariant(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    code, report, output = run_chaos(
        tmp_path, src_env, *external("--workflows", "30", "--seed", "1", "--duration", "300")
    )
    assert code == 0, output
    assert report["passed"] and report["violations"] == []
    points = {row["point"] for row in report["crash_points"]}
    assert {"agent:after_intent", "agent:after_call", "projector:mid_batch"} <= points
    assert "recovery:mid_resolution" in points and "consumer:sigstop_sigcont" in points
    assert "agent:resume_races_recovery" in points
    assert "replay with --seed 1" in output


@pytest.mark.e2e
def test_a_broken_build_fails_with_the_violation_named(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    code, report, output = run_chaos(
        tmp_path,
        src_env,
        *external("--workflows", "30", "--seed", "1", "--duration", "300"),
        "--break",
        "redrive-ignores-key",
    )
    assert code != 0
    assert not report["passed"]
    assert "keyed_effect_exactly_once" in {v["invariant"] for v in report["violations"]}
    assert "VIOLATION keyed_effect_exactly_once" in output


@pytest.mark.e2e
def test_graceful_broker_restarts_on_durable_storage(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    code, report, output = run_chaos(
        tmp_path,
        src_env,
        "--workflows",
        "6",
        "--seed",
        "2",
        "--duration",
        "300",
        "--durable-broker",
        "--parallel",
        "1",
    )
    assert code == 0, output
    restarts = [r for r in report["crash_points"] if r["point"] == "broker:graceful_restart"]
    assert restarts and restarts[0]["count"] >= 1

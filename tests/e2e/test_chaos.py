"""The chaos harness end to end: a short run passes, a broken build is caught by name, and
three Apache Kafka nodes lose partition leaders under the same plan."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CHAOS = [sys.executable, "-m", "stepledger", "chaos"]
# The same command with the test-only switches (--break), kept out of the shipped CLI.
CHAOS_TEST = [sys.executable, "-m", "stepledger_dev.chaos"]

# A run's budget (--duration 240) plus its bounded tail (settle, projector stop, evidence)
# stays inside this, so a slow run fails with the harness's own report, not a bare timeout.
pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def external(engine: str, request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """Run on the session's broker unless it is Tansu (then chaos starts its own)."""
    bootstrap = None if engine == "tansu" else request.getfixturevalue("bootstrap")

    def args(*given: str) -> list[str]:
        return [*given, "--bootstrap", bootstrap] if bootstrap else list(given)

    return args


def run_chaos(
    tmp_path: Path, env: dict[str, str], *args: str, command: list[str] = CHAOS
) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / "work" / "chaos-report.json"  # its default place
    proc = subprocess.run(
        [*command, "--workdir", str(tmp_path / "work"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert not (tmp_path / "chaos-report.json").exists(), "a report left in the cwd"
    output = proc.stdout + proc.stderr
    agents = tmp_path / "work" / "agents.log"
    if proc.returncode and agents.exists():  # where a stuck agent's threads were, if one was
        output += "\n--- agents.log (tail) ---\n" + agents.read_text()[-6000:]
    return proc.returncode, json.loads(report.read_text()), output


@pytest.mark.e2e
def test_short_chaos_run_keeps_every_invariant(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    # The agents' clock runs two minutes ahead of the daemons': every intent an agent left in
    # doubt is still decided within its deadline plus the grace by one clock (issue 42).
    args = ("--workflows", "30", "--seed", "1", "--duration", "240", "--agent-skew", "120")
    code, report, output = run_chaos(tmp_path, src_env, *external(*args))
    assert code == 0, output
    assert report["passed"] and report["violations"] == []
    assert report["options"]["agent_skew_s"] == "120.0"
    points = {row["point"] for row in report["crash_points"]}
    assert {"agent:after_intent", "agent:after_call", "projector:mid_batch"} <= points
    assert "recovery:mid_resolution" in points and "consumer:sigstop_sigcont" in points
    assert "agent:resume_races_recovery" in points and "agent:frozen_after_intent" in points
    assert "agent:second_runner" in points
    assert "replay with --seed 1" in output
    # A frozen runner, once continued, calls nothing (a workflow of its batch may have ended
    # before reaching its freeze point, e.g. a slow service: its line says so).
    frozen = (tmp_path / "work" / "agent-reports-frozen.jsonl").read_text().splitlines()
    assert any("nothing was called" in line for line in frozen), frozen
    assert not any('"completed"' in line for line in frozen), frozen


@pytest.mark.e2e
def test_a_broken_build_fails_with_the_violation_named(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    code, report, output = run_chaos(
        tmp_path,
        src_env,
        *external("--workflows", "12", "--seed", "1", "--duration", "240"),
        "--break",
        "redrive-ignores-key",
        command=CHAOS_TEST,
    )
    assert code != 0
    assert not report["passed"]
    assert "keyed_effect_exactly_once" in {v["invariant"] for v in report["violations"]}
    assert "VIOLATION keyed_effect_exactly_once" in output


@pytest.mark.e2e
def test_two_deployments_on_one_cluster_keep_every_invariant_and_share_no_state(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    # The agents' clock runs two minutes behind the daemons' here (the short run's is ahead):
    # nothing is decided early by the one clock (issue 42).
    args = ("--workflows", "20", "--seed", "3", "--duration", "300", "--two-deployments")
    skew = ("--agent-skew", "-120")
    code, report, output = run_chaos(tmp_path, src_env, *external(*args, *skew))
    assert code == 0, output
    assert report["passed"] and report["violations"] == []
    assert report["options"]["agent_skew_s"] == "-120.0"
    assert "cluster:second_deployment" in {row["point"] for row in report["crash_points"]}
    assert "neighbour: round 1" in output  # the second deployment ran its rounds too


@pytest.mark.e2e
def test_two_deployments_given_one_state_topic_are_caught(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    """The harness catches what 0.3.0's defaults did: one checkpoint topic and changelog."""
    args = ("--workflows", "10", "--seed", "3", "--duration", "240", "--two-deployments")
    code, report, _ = run_chaos(
        tmp_path, src_env, *external(*args), "--break", "shared-state", command=CHAOS_TEST
    )
    assert code != 0 and not report["passed"]
    found = {v["invariant"] for v in report["violations"]}
    assert {"no_state_name_shared", "state_records_name_their_log"} <= found, found


@pytest.mark.e2e
@pytest.mark.own_tansu
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
        "240",
        "--durable-broker",
        "--parallel",
        "1",
    )
    assert code == 0, output
    restarts = [r for r in report["crash_points"] if r["point"] == "broker:graceful_restart"]
    assert restarts and restarts[0]["count"] >= 1


@pytest.mark.e2e
@pytest.mark.kafka_only
@pytest.mark.skipif(shutil.which("java") is None, reason="needs java for Apache Kafka")
@pytest.mark.timeout(420)
def test_three_secured_kafka_nodes_lose_leaders_under_two_fleets_and_every_invariant_holds(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    """Two fleets (``--two-deployments``) on a secured 3-node cluster (``--secure``: SASL/SCRAM,
    ACLs, every process with its own role's credentials) while brokers lose leadership: each
    fleet keeps every invariant and they share no state.  The open 3-node cluster's faults are
    run by tests/e2e/test_kafka_cluster_faults.py."""
    env = {k: v for k, v in src_env.items() if k != "STEPLEDGER_BOOTSTRAP"}
    code, report, output = run_chaos(
        tmp_path,
        env,
        *("--engine", "kafka", "--nodes", "3", "--secure", "--two-deployments"),
        *("--workflows", "12", "--seed", "3", "--duration", "240"),
    )
    assert code == 0, output
    assert report["passed"] and report["violations"] == []
    assert "cluster:second_deployment" in {row["point"] for row in report["crash_points"]}
    assert report["options"]["secure"] == "True"
    fleets = sorted((tmp_path / "work").glob("**/fleet/*-recovery.toml"))
    assert len(fleets) == 2, fleets  # each deployment a fleet, its daemons on its own configs
    assert "not authorised" not in output
    counts = {row["point"]: row["count"] for row in report["crash_points"]}
    assert counts.get("broker:leader_sigkill", 0) >= 1, report["crash_points"]
    assert counts.get("broker:sigstop_sigcont", 0) >= 1, report["crash_points"]
    assert any(f.startswith("sigkill node") for f in report["broker_faults"])
    assert report["acked_in_broker_faults"] >= 1, "no agent wrote while a broker was down"
    assert report["seconds"] <= 240


def test_the_shipped_cli_has_no_test_only_switch(src_env: dict[str, str]) -> None:
    done = subprocess.run(
        [*CHAOS, "--break", "redrive-ignores-key"],
        capture_output=True,
        text=True,
        env=src_env,
        timeout=60,
    )
    assert done.returncode == 2 and "No such option" in done.stderr

"""Pause a fleet of running workflows mid-run, SIGKILL it paused, start it again, unpause.

Real parts only: the example payments service counting its own charges, the fleet as a
subprocess (``agent_fleet.py``: 20 workflows of 8 keyed charges each, one step a beat,
waiting out a pause), the broker from the fixtures and the ``stepledger`` CLI.  After the
pause event no step of a workflow calls its tool (every intent after it records
``not_happened``, nothing charged under its key); steps in flight finish; a SIGKILLed
paused fleet started again (another app version) stays paused; the unpause lets every
workflow complete with each charge made once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.state import RunStatus, replay
from stepledger.kafka.reader import read_topic
from stepledger_dev.examples.clients import PaymentsClient, RunningService, start_service

pytestmark = pytest.mark.e2e
FLEET = [sys.executable, str(Path(__file__).with_name("agent_fleet.py"))]
CLI = [sys.executable, "-m", "stepledger"]
WORKFLOWS, STEPS = 20, 8
IDS = [f"fleet-{i}" for i in range(WORKFLOWS)]


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> None:
    ends = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < ends, f"timed out waiting for {what}"
        time.sleep(0.2)


def workflow_events(settings: Settings, expect: Iterable[str] = IDS) -> dict[str, list[ev.Event]]:
    """Every workflow's events, read again until the expected workflows are there: a read
    on Tansu has at times reported a partition's end without its records (bounded)."""
    wanted, ends = set(expect), time.monotonic() + 30.0
    while True:
        found: dict[str, list[ev.Event]] = {}
        for record in read_topic(settings, Codec(), idle_timeout=0.3):
            if record.event is not None:
                found.setdefault(record.event.workflow_id, []).append(record.event)
        if wanted <= set(found) or time.monotonic() > ends:
            return found


def charged(payments: RunningService) -> dict[str, int]:
    """The charges the service made, by idempotency key (its own count, replays excluded)."""
    by_kind: dict[str, dict[str, int]] = PaymentsClient(payments.url).effects()["by_kind"]
    return dict(by_kind.get("charge", {}))


def after_pause(events: list[ev.Event]) -> tuple[list[ev.Event], list[ev.Event]]:
    """The workflow's intents before and after its first pause, in log order."""
    at = next(i for i, e in enumerate(events) if isinstance(e.body, ev.WorkflowPaused))
    intents = [(i, e) for i, e in enumerate(events) if isinstance(e.body, ev.StepIntended)]
    return [e for i, e in intents if i < at], [e for i, e in intents if i > at]


def key(intent: ev.Event) -> str:
    assert isinstance(intent.body, ev.StepIntended)
    return intent.body.idempotency_key


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[RunningService]:
    service = start_service("payments", tmp_path / "payments.sqlite")
    try:
        yield service
    finally:
        service.stop()


def test_a_paused_fleet_stays_paused_through_a_sigkill_and_completes_once_unpaused(
    settings: Settings, payments: RunningService, src_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
        "STEPLEDGER_PAYMENTS_URL": payments.url,
        "STEPLEDGER_TOOL_TIMEOUT_S": "5.0",
    }

    def fleet(version: str) -> subprocess.Popen[str]:
        out = (tmp_path / f"fleet-{version}.out").open("w")
        return subprocess.Popen(
            [*FLEET, "fleet", str(WORKFLOWS), str(STEPS), "1.0"],
            env={**env, "FLEET_APP_VERSION": version},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def cli(*args: str) -> str:
        done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = fleet("v1")
    try:
        wait_for("the fleet mid-run", lambda: len(charged(payments)) >= WORKFLOWS)
        shown = cli("workflows", "pause", *IDS, "--by", "ops", "--reason", "provider incident")
        assert shown.count("paused (pause 1)") == WORKFLOWS, shown

        def settled() -> bool:
            # Steps in flight finished: every intent has its outcome, the charges stand still.
            before = charged(payments)
            time.sleep(1.0)
            logs = workflow_events(settings)
            open_steps = [s for wf in IDS for s in replay(wf, logs[wf]).in_doubt()]
            return not open_steps and charged(payments) == before

        wait_for("the steps in flight to finish", settled)
        logs, paid = workflow_events(settings), charged(payments)
        assert WORKFLOWS <= len(paid) < WORKFLOWS * STEPS
        for wf in IDS:
            before, after = after_pause(logs[wf])
            assert all(key(i) in paid for i in before), wf  # in flight: finished
            state = replay(wf, logs[wf])
            for intent in after:  # after the pause: stopped before the call
                assert key(intent) not in paid, wf
                assert state.steps[intent.step_id or ""].status.value == "not_happened"
            assert state.shown_status is RunStatus.PAUSED
        assert set(paid.values()) == {1}

        first.kill()  # SIGKILL, paused
        first.wait(timeout=30)
        second = fleet("v2")
        try:

            def reclaimed() -> bool:
                logs = workflow_events(settings)
                return all(replay(wf, logs[wf]).attempt >= 2 for wf in IDS)

            wait_for("the fleet started again to claim every workflow", reclaimed)
            time.sleep(1.0)  # a fleet that ignored the pause would charge within its beat
            assert charged(payments) == paid
            cli("workflows", "unpause", *IDS, "--by", "ops", "--reason", "provider back")
            assert second.wait(timeout=120) == 0, (tmp_path / "fleet-v2.out").read_text()
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
    reports = [
        json.loads(line)
        for line in (tmp_path / "fleet-v2.out").read_text().splitlines()
        if line.startswith("{")
    ]
    assert sorted(r["id"] for r in reports if r.get("result") == STEPS) == sorted(IDS)
    final = charged(payments)
    assert len(final) == WORKFLOWS * STEPS and set(final.values()) == {1}
    logs = workflow_events(settings)
    for wf in IDS:
        state = replay(wf, logs[wf])
        assert state.status is RunStatus.COMPLETED and not state.anomalies, wf
        assert state.versions[1][0] == "v1" and state.versions[2][0] == "v2"
        outcomes = [e.body for e in logs[wf] if isinstance(e.body, ev.StepOutcome)]
        assert sum(o.status is OutcomeStatus.SUCCEEDED for o in outcomes) == STEPS


def test_a_restart_after_a_fixed_tool_bug_replays_the_prefix_without_a_call(
    settings: Settings, payments: RunningService, src_env: dict[str, str]
) -> None:
    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
        "STEPLEDGER_PAYMENTS_URL": payments.url,
    }

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), env={**env, **extra}, capture_output=True, text=True, timeout=90
        )

    buggy = run(*FLEET, "rs", "1", "4", "0", FLEET_BUG_AT="2")
    assert buggy.returncode == 3 and "tool bug" in buggy.stdout, buggy.stdout + buggy.stderr
    assert len(charged(payments)) == 2
    # A deploy mid-run: version 2 names its steps otherwise.  It stops in one line naming
    # both versions and calls nothing.
    other = run(*FLEET, "rs", "1", "4", "0", FLEET_STEP_NAME="pay", FLEET_APP_VERSION="v2")
    assert other.returncode == 3 and "PlanMismatchError" in other.stdout, other.stdout
    assert "recorded by app version unset" in other.stdout, other.stdout
    assert "this run is app version v2" in other.stdout and len(charged(payments)) == 2
    restart = [*CLI, "workflows", "restart", "rs-0", "--from", "charge-2", "--as", "rs2-0"]
    shown = run(*restart)
    assert shown.returncode == 0 and "nothing done" in shown.stdout, shown.stderr
    assert "replays the recorded outcomes of charge-0, charge-1 (no call)" in shown.stdout
    done = run(*restart, "--yes", "--by", "ops", "--reason", "fixed the unit bug")
    assert "rs-0: restarted as rs2-0 from charge-2" in done.stdout, done.stdout + done.stderr
    fixed = run(*FLEET, "rs2", "1", "4", "0")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    paid = charged(payments)
    assert len(paid) == 4 and set(paid.values()) == {1}  # the prefix made no second call
    logs = workflow_events(settings, ("rs-0", "rs2-0"))
    old, new = replay("rs-0", logs["rs-0"]), replay("rs2-0", logs["rs2-0"])
    assert old.status is RunStatus.RESTARTED and old.restarted_as == "rs2-0"
    assert new.status is RunStatus.COMPLETED and new.restarted_from == "rs-0"
    keys = {s.step_id: s.idempotency_key for s in new.steps.values()}
    assert keys["charge-0"] == old.steps["charge-0"].idempotency_key  # the effect's own key
    assert keys["charge-2"] != old.steps["charge-2"].idempotency_key  # anew: the new id's

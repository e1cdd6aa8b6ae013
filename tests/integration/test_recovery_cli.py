"""Recovery commands on the real broker: reconcile, the human queue, daemon health and metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.factory import EventFactory
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger_dev.broker import free_port
from stepledger_dev.examples import tools as ex
from stepledger_dev.examples.clients import PaymentsClient, RunningService, start_service
from tests.e2e.recovery_helpers import CLI, LogWatcher, append_events, run_cli, wait_for

CHARGE = {"amount": 450, "currency": "EUR", "customer": "cus_r"}


@pytest.fixture(scope="module")
def payments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    service = start_service("payments", tmp_path_factory.mktemp("cli") / "payments.sqlite")
    yield service
    service.stop()


def cli_env(settings: Settings, payments: RunningService | None = None) -> dict[str, str]:
    env = {
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
    }
    if payments is not None:
        env["STEPLEDGER_PAYMENTS_URL"] = payments.url
    return env


def test_reconcile_reports_each_disagreement_and_records_it_once(
    settings: Settings, payments: RunningService
) -> None:
    tool = ex.payments_tool(payments.url, timeout_s=2.0)
    agent = EventFactory(settings.fleet_id, "agent")
    client = PaymentsClient(payments.url)
    events: list[ev.Event] = []
    plan = {  # workflow -> (agent outcome or None, does the service have the charge?)
        "missing": (OutcomeStatus.SUCCEEDED, False),
        "unrecorded": (OutcomeStatus.FAILED, True),
        "agree": (OutcomeStatus.SUCCEEDED, True),
        "in-doubt": (None, True),
    }
    run = uuid.uuid4().hex[:6]
    for name, (status, charged) in plan.items():
        intent = agent.intent(f"{name}-{run}", "s", tool, CHARGE, sequence=0)
        assert isinstance(intent.body, ev.StepIntended)
        events.append(intent)
        if status is not None:
            events.append(agent.outcome(f"{name}-{run}", "s", attempt=1, status=status))
        if charged:
            client.charge(intent.body.idempotency_key, 450, "EUR", "cus_r")
    append_events(settings, events)
    env = cli_env(settings, payments)
    args = [
        "reconcile",
        "--tool",
        ex.PAYMENTS,
        "--tools",
        "stepledger_dev.examples.tools:registry",
        "--no-entry-points",
        "--json",
    ]
    first = run_cli(env, *args, "--record")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    found = {(d["workflow_id"].split("-")[0], d["kind"]) for d in lines[:-1]}
    assert found == {
        ("missing", "missing_effect"),
        ("unrecorded", "unrecorded_effect"),
        ("in", "unrecorded_effect"),
    }
    assert lines[-1]["summary"] == {"checked": 4, "disagreements": 3, "errors": 0, "recorded": 3}
    again = run_cli(env, *args, "--record")
    assert json.loads(again.stdout.splitlines()[-1])["summary"]["recorded"] == 3
    watcher = LogWatcher(settings)
    try:
        anomalies = [e for e in watcher.refresh().events if isinstance(e.body, ev.AnomalyObserved)]
    finally:
        watcher.close()
    assert len(anomalies) == 6 and len({e.event_id for e in anomalies}) == 3
    assert {e.body.source for e in anomalies} == {Source.RECONCILE}  # type: ignore[union-attr]
    recent = run_cli(env, *args, "--since", "0s")
    assert json.loads(recent.stdout.splitlines()[-1])["summary"]["checked"] == 0


def test_escalations_filter_by_fleet_tool_and_age_and_workflows_are_cleared(
    settings: Settings,
) -> None:
    old = datetime.now(UTC) - timedelta(hours=3)
    a = EventFactory("fleet-a", "recovery", clock=lambda: old)
    b = EventFactory("fleet-b", "recovery")
    mail = ex.email_tool("http://127.0.0.1:9")
    pay = ex.payments_tool("http://127.0.0.1:9")
    events = [
        a.intent("wa", "s", mail, {"to": "x"}, sequence=0),
        a.envelope(
            "wa",
            "s",
            ev.StepAbandoned(reason="policy", escalation_id="esc-a", source=Source.RECOVERY),
        ),
        b.intent("wb", "s", pay, CHARGE, sequence=0),
        b.envelope(
            "wb",
            "s",
            ev.StepAbandoned(reason="exhausted", escalation_id="esc-b", source=Source.RECOVERY),
        ),
        b.workflow_started("wd", name="", attempt=1, read_only=False, max_attempts=1),
        b.envelope(
            "wd",
            None,
            ev.WorkflowDeadLettered(attempt=1, reason="too many resumes", escalation_id="esc-wd"),
        ),
    ]
    append_events(settings, events)
    env = cli_env(settings)

    def listed(*extra: str) -> set[str]:
        result = run_cli(env, "escalations", "list", "--json", *extra)
        assert result.returncode == 0, result.stderr
        return {json.loads(line)["escalation_id"] for line in result.stdout.splitlines()}

    assert listed() == {"esc-a", "esc-b", "esc-wd"}
    assert listed("--fleet", "fleet-a") == {"esc-a"}
    assert listed("--tool", ex.PAYMENTS) == {"esc-b"}
    assert listed("--older-than", "2h") == {"esc-a"}
    wrong = run_cli(env, "escalations", "resolve", "esc-b", "--cleared", "--by", "ana")
    assert (
        wrong.returncode == 1 and wrong.stderr.count("\n") == 1 and "takes happened" in wrong.stderr
    )
    cleared = run_cli(env, "escalations", "resolve", "esc-wd", "--cleared", "--by", "ana")
    assert cleared.returncode == 0, cleared.stderr
    missing = run_cli(env, "escalations", "resolve", "esc-b", "--by", "ana")
    assert missing.returncode == 2 and "--happened" in missing.stderr
    assert listed() == {"esc-a", "esc-b"}
    text = run_cli(env, "escalations", "list")
    assert "esc-a" in text.stdout and "policy" in text.stdout


def test_daemon_serves_metrics_and_health_and_stops_cleanly_on_sigterm(
    settings: Settings, payments: RunningService, tmp_path: Path
) -> None:
    port = free_port()
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **cli_env(settings, payments)}
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "recover",
            "--tools",
            "stepledger_dev.examples.tools:registry",
            "--no-entry-points",
            "--state-dir",
            str(state),
            "--metrics-port",
            str(port),
            "--session-timeout",
            "2s",
            "--group",
            f"recovery-{settings.topic}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        tool = ex.payments_tool(payments.url, timeout_s=3600)  # never due during the test
        append_events(
            settings,
            [
                EventFactory(settings.fleet_id, "agent").intent(
                    "wf-open", "s", tool, CHARGE, sequence=0
                )
            ],
        )

        def scraped() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    body = r.read().decode()
            except OSError:
                return None
            return body if "stepledger_recovery_open_intents 1.0" in body else None

        body = wait_for(scraped, 30, "the open intent to show in the metrics")
        assert "stepledger_recovery_assigned_partitions 3.0" in body
        assert "stepledger_recovery_oldest_overdue_intent_seconds" in body
        healthy = run_cli(
            dict(os.environ),
            "recover-health",
            "--state-dir",
            str(state),
            "--group",
            f"recovery-{settings.topic}",
        )
        assert healthy.returncode == 0 and json.loads(healthy.stdout)["open_intents"] == 1
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
    gone = run_cli(dict(os.environ), "recover-health", "--state-dir", str(state))
    assert gone.returncode == 1 and "no recovery heartbeat" in gone.stderr
    # The state it stopped with is on the changelog, for whichever daemon comes next.
    store = KafkaCheckpointStore(settings, f"recovery-{settings.topic}")
    try:
        saved = [store.load(settings.topic, p) for p in range(3)]
    finally:
        store.close()
    steps = [step for found in saved if found is not None for step in found.steps]
    assert steps == [("wf-open", "s")]
    assert sum(found.next_offset for found in saved if found is not None) == 1
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    assert json.loads(lines[-1])["message"] == "recovery stopped"


def test_bad_tools_path_is_a_one_line_error(settings: Settings) -> None:
    result = run_cli(
        cli_env(settings),
        "recover",
        "--tools",
        "nowhere:registry",
        "--no-entry-points",
        "--max-seconds",
        "1",
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "cannot import 'nowhere'" in result.stderr

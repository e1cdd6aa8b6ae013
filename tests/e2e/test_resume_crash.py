"""The trip agent SIGKILLed at every step boundary, then resumed: every effect happens once.

Real parts only: the three example services as subprocesses, the agent as a subprocess
(``python -m stepledger_dev.examples.trip_agent``) that SIGKILLs itself, the broker from the
fixtures, and the ``stepledger`` CLI for the human's answers.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.letter import dead_letter_info
from stepledger.domain.enums import Source
from stepledger.domain.ids import idempotency_key
from stepledger.domain.state import RunStatus, StepStatus, WorkflowState, replay
from stepledger.kafka.reader import read_topic
from stepledger_dev.examples.clients import (
    BookingsClient,
    PaymentsClient,
    RunningService,
    start_service,
)
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS
from stepledger_dev.examples.trip_agent import BOUNDARIES

pytestmark = pytest.mark.e2e
AGENT = [sys.executable, "-m", "stepledger_dev.examples.trip_agent"]
CLI = [sys.executable, "-m", "stepledger"]


@dataclass
class Stack:
    """The services, the settings and the environment every subprocess gets."""

    settings: Settings
    services: dict[str, RunningService]
    env: dict[str, str]

    def agent(self, *targets: str, extra: tuple[str, ...] = ()) -> tuple[int, list[dict[str, Any]]]:
        proc = subprocess.run(
            [*AGENT, *targets, *extra], env=self.env, capture_output=True, text=True, timeout=90
        )
        reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, reports

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], env=self.env, capture_output=True, text=True, timeout=60
        )

    def workflows(self) -> dict[str, WorkflowState]:
        events = [r.event for r in read_topic(self.settings, Codec(), idle_timeout=0.3)]
        ids = {e.workflow_id for e in events if e is not None}
        return {
            wf: replay(wf, [e for e in events if e is not None and e.workflow_id == wf])
            for wf in ids
        }

    def effects(self, workflow_id: str) -> dict[str, int]:
        """The real effects the services performed for one workflow."""
        payments = PaymentsClient(self.services["payments"].url)
        bookings = BookingsClient(self.services["bookings"].url)
        counts = {
            "charge": _keyed(payments, "charge", idempotency_key(workflow_id, "charge", PAYMENTS)),
            "booking": _keyed(bookings, "booking", idempotency_key(workflow_id, "book", BOOKINGS)),
            "cancel": _keyed(bookings, "cancel", idempotency_key(workflow_id, "book", BOOKINGS)),
            "email": self.emails_to(f"{workflow_id}@example.test"),
        }
        return counts

    def emails_to(self, address: str) -> int:
        # The email service has no key to count by: its own records say who got what.
        path = self.services["email"].state_path
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT body FROM records WHERE kind = 'email'").fetchall()
        return sum(1 for (body,) in rows if json.loads(body)["to"] == address)


def _keyed(client: PaymentsClient | BookingsClient, kind: str, base_key: str) -> int:
    # A retry after "not happened" uses the base key plus "-aN": count them all.
    by_kind = client.effects()["by_kind"].get(kind, {})
    return sum(n for key, n in by_kind.items() if key.startswith(base_key))


NEVER_CRASHED = {"charge": 1, "booking": 1, "cancel": 0, "email": 1}


@pytest.fixture
def stack(settings: Settings, tmp_path: Path, src_env: dict[str, str]) -> Iterator[Stack]:
    services = {
        kind: start_service(kind, tmp_path / f"{kind}.sqlite")
        for kind in ("payments", "bookings", "email")
    }
    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
        "STEPLEDGER_PAYMENTS_URL": services["payments"].url,
        "STEPLEDGER_BOOKINGS_URL": services["bookings"].url,
        "STEPLEDGER_EMAIL_URL": services["email"].url,
        # No service here hangs: a short timeout only turns a loaded machine's slow reply
        # into an in-doubt step, which this test does not expect.
        "STEPLEDGER_TOOL_TIMEOUT_S": "10.0",
    }
    try:
        yield Stack(settings, services, env)
    finally:
        for service in services.values():
            service.stop()


def test_killed_at_every_step_boundary_then_resumed_effects_happen_exactly_once(
    stack: Stack,
) -> None:
    # The boundaries only: a frozen runner waits for a harness to continue it (the chaos
    # harness and test_runners.py cover frozen and second runners).
    kills = {f"trip-{n}-{point}": f"{n}:{point}" for n in range(1, 5) for point in BOUNDARIES}
    code, reports = stack.agent("trip-control", *(f"{wf}@{at}" for wf, at in kills.items()))
    assert code == -9, "the agent died by SIGKILL"
    assert reports == [{"workflow": "trip-control", "status": "completed", "attempt": 1}]
    crashed = stack.workflows()
    for wf, at in kills.items():
        assert crashed[wf].status is RunStatus.RUNNING, f"{wf} was cut short at {at}"

    code, reports = stack.agent(*kills)
    by_wf = {r["workflow"]: r for r in reports}
    in_doubt_emails = {"trip-4-after_intent", "trip-4-after_effect"}
    for wf in kills:
        expected = "escalated" if wf in in_doubt_emails else "completed"
        assert by_wf[wf]["status"] == expected, by_wf[wf]
    assert code == 3, "two workflows wait for a human"

    # The human checks the email service and answers each escalation with the CLI.
    for wf in sorted(in_doubt_emails):
        sent = stack.emails_to(f"{wf}@example.test")
        verdict = "--happened" if sent else "--not-happened"
        answer = stack.cli(
            "escalations", "resolve", by_wf[wf]["escalation_id"], verdict, "--by", "qa"
        )
        assert answer.returncode == 0, answer.stderr
    code, reports = stack.agent(*sorted(in_doubt_emails))
    assert code == 0 and {r["status"] for r in reports} == {"completed"}, reports

    final = stack.workflows()
    for wf in ["trip-control", *kills]:
        assert stack.effects(wf) == NEVER_CRASHED, wf
        state = final[wf]
        assert state.status is RunStatus.COMPLETED, wf
        assert all(s.status is StepStatus.SUCCEEDED for s in state.steps.values()), wf
    # What the resumes did: query-found effects kept, missing ones done again, reads re-run.
    assert final["trip-2-after_effect"].steps["charge"].resolved_by is Source.RECOVERY_QUERY
    assert final["trip-3-after_effect"].steps["book"].resolved_by is Source.RECOVERY_QUERY
    assert final["trip-3-after_intent"].steps["book"].attempt == 2
    assert final["trip-1-after_intent"].steps["quote"].attempt == 1
    assert {wf: final[wf].attempt for wf in kills} == {
        wf: 3 if wf in in_doubt_emails else 2 for wf in kills
    }
    assert final["trip-4-after_intent"].steps["email"].attempt == 2, "re-sent after 'not happened'"
    assert final["trip-4-after_effect"].steps["email"].attempt == 1, "the sent email was kept"


def test_a_crash_looping_workflow_is_dead_lettered_until_a_human_clears_it(
    stack: Stack,
) -> None:
    env = stack.env
    stack.env = {**env, "STEPLEDGER_MAX_ATTEMPTS": "3"}
    for attempt in (1, 2, 3):
        code, reports = stack.agent("loop@3:before_intent")
        assert code == -9 and reports == [], f"attempt {attempt} was killed"
    code, reports = stack.agent("loop@3:before_intent")
    assert code == 3 and reports[0]["status"] == "dead_lettered"
    escalation = reports[0]["escalation_id"]
    assert "workflows clear loop" in reports[0]["error"]

    state = stack.workflows()["loop"]
    assert state.status is RunStatus.DEAD_LETTERED and state.escalation_id == escalation
    letters = list(
        read_topic(stack.settings, Codec(), topic=stack.settings.dlq_topic, idle_timeout=0.3)
    )
    assert len(letters) == 1
    info = dead_letter_info(letters[0].headers)
    assert info["stage"] == "resume" and "resume_limit" in info["error"]
    assert letters[0].event is not None and letters[0].event.type == "workflow_dead_lettered"

    code, reports = stack.agent("loop")
    assert code == 3 and reports[0]["status"] == "dead_lettered", "refused until cleared"
    assert stack.effects("loop")["booking"] == 0

    shown = stack.cli("workflows", "show", "loop")
    assert shown.returncode == 0 and "dead_lettered" in shown.stdout and escalation in shown.stdout
    cleared = stack.cli("workflows", "clear", "loop", "--by", "qa", "--note", "fixed the bug")
    assert cleared.returncode == 0, cleared.stderr
    again = stack.cli("workflows", "clear", "loop", "--by", "qa")
    assert again.returncode == 1 and "not dead-lettered" in again.stderr
    assert "Traceback" not in again.stderr

    code, reports = stack.agent("loop")
    assert code == 0 and reports[0]["status"] == "completed" and reports[0]["attempt"] == 5
    assert stack.effects("loop") == NEVER_CRASHED
    stack.env = env

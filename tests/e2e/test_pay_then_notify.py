"""Pay-then-notify SIGKILLed at every boundary, then resumed: one charge, at most one email.

Real parts only: the example payments and email services as subprocesses counting their own
effects, the agent as a subprocess (``python -m stepledger_dev.examples.pay_notify_agent``)
that SIGKILLs itself at its kill points, the broker from the fixtures, and the ``stepledger``
CLI for the person who answers the escalations.  The charge is keyed and cannot be undone
(the pivot); the receipt email has no key and no undo: it runs at most once, and whenever
whether it was sent is unknown (or it was refused) a person decides.
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
from stepledger.domain.ids import idempotency_key
from stepledger.domain.state import RunStatus, StepStatus, WorkflowState, replay
from stepledger.kafka.reader import read_topic
from stepledger_dev.examples.clients import PaymentsClient, RunningService, start_service
from stepledger_dev.examples.tools import CAPTURE

pytestmark = pytest.mark.e2e
AGENT = [sys.executable, "-m", "stepledger_dev.examples.pay_notify_agent"]
CLI = [sys.executable, "-m", "stepledger"]
#: Where each workflow of the crashed run dies: the boundaries docs/agents.md walks through.
KILLS = {
    "pn-before-charge": "charge:before_intent",
    "pn-charge-intent": "charge:after_intent",
    "pn-charge-effect": "charge:after_effect",
    "pn-after-charge": "charge:after_outcome",
    "pn-email-intent": "email:after_intent",
    "pn-email-effect": "email:after_effect",
    "pn-after-email": "email:after_outcome",
}
#: Whether the email was sent is unknown after these crashes: a person decides.
IN_DOUBT = {"pn-email-intent", "pn-email-effect"}


@dataclass
class Stack:
    """The services, the settings and the environment every subprocess gets."""

    settings: Settings
    services: dict[str, RunningService]
    env: dict[str, str]

    def agent(self, *targets: str, extra: tuple[str, ...] = ()) -> tuple[int, list[dict[str, Any]]]:
        proc = subprocess.run(
            [*AGENT, *targets, *extra], env=self.env, capture_output=True, text=True, timeout=120
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

    def charges(self, workflow_id: str) -> int:
        """Charges the payments service made for the workflow (by its key, retries included)."""
        key = idempotency_key(workflow_id, "charge", CAPTURE)
        by_kind = PaymentsClient(self.services["payments"].url).effects()["by_kind"]
        return sum(n for k, n in by_kind.get("charge", {}).items() if k.startswith(key))

    def emails(self, workflow_id: str) -> int:
        """Receipts the email service sent to the workflow's customer (its own records)."""
        path = self.services["email"].state_path
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT body FROM records WHERE kind = 'email'").fetchall()
        return sum(1 for (body,) in rows if json.loads(body)["to"] == f"{workflow_id}@example.test")

    def open_escalations(self) -> dict[str, str]:
        """``stepledger escalations list``: open escalation id by workflow (each one shown)."""
        listed = self.cli("escalations", "list", "--json")
        shown = self.cli("escalations", "list")
        assert listed.returncode == 0 and shown.returncode == 0, listed.stderr + shown.stderr
        found = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
        assert all(e["escalation_id"] in shown.stdout for e in found), shown.stdout
        return {e["workflow_id"]: e["escalation_id"] for e in found}


@pytest.fixture
def stack(settings: Settings, tmp_path: Path, src_env: dict[str, str]) -> Iterator[Stack]:
    services = {
        kind: start_service(kind, tmp_path / f"{kind}.sqlite") for kind in ("payments", "email")
    }
    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
        "STEPLEDGER_PAYMENTS_URL": services["payments"].url,
        "STEPLEDGER_EMAIL_URL": services["email"].url,
        "STEPLEDGER_TOOL_TIMEOUT_S": "1.0",
    }
    try:
        yield Stack(settings, services, env)
    finally:
        for service in services.values():
            service.stop()


def test_killed_at_every_boundary_the_charge_happens_once_and_the_email_at_most_once(
    stack: Stack,
) -> None:
    code, reports = stack.agent("pn-control", *(f"{wf}@{at}" for wf, at in KILLS.items()))
    assert code == -9, "the agent died by SIGKILL"
    assert reports == [{"workflow": "pn-control", "status": "completed", "attempt": 1}]
    crashed = stack.workflows()
    assert all(crashed[wf].status is RunStatus.RUNNING for wf in KILLS if wf in crashed)

    code, reports = stack.agent(*KILLS)
    by_wf = {r["workflow"]: r for r in reports}
    assert code == 3, reports
    for wf in KILLS:
        expected = "escalated" if wf in IN_DOUBT else "completed"
        assert by_wf[wf]["status"] == expected, by_wf[wf]
        assert stack.charges(wf) == 1, f"{wf}: charged once, whatever the crash"
        assert stack.emails(wf) <= 1, f"{wf}: the receipt is never sent twice"
    # Never stuck silently: what did not complete is in the human queue, and no run of the
    # agent sends the email whose fate is unknown.
    listed = stack.open_escalations()
    assert {wf: listed.get(wf) for wf in IN_DOUBT} == {
        wf: by_wf[wf]["escalation_id"] for wf in IN_DOUBT
    }
    states = stack.workflows()
    assert all(states[wf].status is RunStatus.COMPLETED for wf in KILLS if wf not in IN_DOUBT)
    code, reports = stack.agent(*sorted(IN_DOUBT))
    assert code == 3 and {r["status"] for r in reports} == {"escalated"}
    assert stack.emails("pn-email-intent") == 0 and stack.emails("pn-email-effect") == 1

    # The person checks the email service and answers.
    for wf in sorted(IN_DOUBT):
        verdict = "--happened" if stack.emails(wf) else "--not-happened"
        answered = stack.cli(
            "escalations", "resolve", by_wf[wf]["escalation_id"], verdict, "--by", "qa"
        )
        assert answered.returncode == 0, answered.stderr
    code, reports = stack.agent(*sorted(IN_DOUBT))
    assert code == 0 and {r["status"] for r in reports} == {"completed"}, reports
    final = stack.workflows()
    for wf in ["pn-control", *KILLS]:
        assert (stack.charges(wf), stack.emails(wf)) == (1, 1), wf
        assert final[wf].status is RunStatus.COMPLETED, wf
        assert all(s.status is StepStatus.SUCCEEDED for s in final[wf].steps.values()), wf
        assert final[wf].steps["email"].after_pivot, wf
    assert final["pn-email-intent"].steps["email"].attempt == 2, "sent after 'not happened'"
    assert final["pn-email-effect"].steps["email"].attempt == 1, "the sent email was kept"
    assert stack.open_escalations() == {}


def test_a_refused_receipt_after_the_charge_goes_to_a_person_and_is_never_resent_alone(
    stack: Stack,
) -> None:
    code, reports = stack.agent("pn-refused", extra=("--email-fault", "reject"))
    assert code == 3 and reports[0]["status"] == "escalated", reports
    escalation = reports[0]["escalation_id"]
    assert stack.open_escalations() == {"pn-refused": escalation}
    state = stack.workflows()["pn-refused"]
    assert state.status is RunStatus.RUNNING and state.steps["email"].status is StepStatus.FAILED
    assert (stack.charges("pn-refused"), stack.emails("pn-refused")) == (1, 0)

    code, reports = stack.agent("pn-refused")  # the service would take it now: not on its own
    assert code == 3 and reports[0]["status"] == "escalated"
    assert reports[0]["escalation_id"] == escalation
    assert stack.emails("pn-refused") == 0

    answered = stack.cli("escalations", "resolve", escalation, "--not-happened", "--by", "qa")
    assert answered.returncode == 0, answered.stderr
    code, reports = stack.agent("pn-refused")
    assert code == 0 and reports[0]["status"] == "completed", reports
    assert (stack.charges("pn-refused"), stack.emails("pn-refused")) == (1, 1)
    assert stack.open_escalations() == {}

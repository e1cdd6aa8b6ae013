"""A runner frozen after its intent while the recovery daemon settles the step.

The daemon (``stepledger recover`` subprocess) escalates the unkeyed email once its deadline
passed; a human answers "not happened"; a second runner resumes and sends it.  The frozen
runner is then continued: it must not send the email a second time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import Verdict
from stepledger.domain.state import StepStatus, replay
from stepledger.kafka import ensure_topics
from stepledger.producer import Ledger, ResumeOptions
from stepledger_dev.examples.clients import _JsonClient
from stepledger_dev.examples.tools import EMAIL, make_registry
from tests.conftest import unique
from tests.e2e.recovery_helpers import (
    TOOL_TIMEOUT_S,
    Stack,
    read_events,
    services_stack,
    wait_for,
)

pytestmark = pytest.mark.e2e
RUNNER = Path(__file__).resolve().parents[1] / "integration" / "agent_runner.py"
MAIL = {"to": "ana@example.com", "subject": "receipt", "body": "thanks"}


@pytest.fixture(scope="module")
def frozen_settings(bootstrap: str) -> Settings:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("events"),
        dlq_topic=unique("dlq"),
        fleet_id="frozen-fleet",
        producer_id="test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    return settings


@pytest.fixture(scope="module")
def stack(frozen_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("frozen")
    with services_stack(base) as stack:
        stack.start_daemon(frozen_settings, base / "state")
        yield stack


def stopped(proc: subprocess.Popen[str]) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_a_frozen_runner_stays_silent_after_the_daemon_and_a_human_settled_its_email(
    stack: Stack, frozen_settings: Settings
) -> None:
    email = _JsonClient(stack.services["email"].url)
    before = email.effect_count("email")
    workflow = unique("wf-frozen")
    settings = frozen_settings
    command = [sys.executable, str(RUNNER), settings.bootstrap, settings.topic, workflow]
    command += ["step", EMAIL, json.dumps(MAIL), "--freeze"]
    frozen = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env=stack.env(settings, RUNNER_NO_REDRIVE="")
    )
    try:
        wait_for(lambda: stopped(frozen) or None, 30, "the runner froze after its intent")

        def escalated() -> str | None:
            events = [e for e in read_events(settings) if e.workflow_id == workflow]
            step = replay(workflow, events).steps.get("step")
            return step.escalation_id if step and step.status is StepStatus.ABANDONED else None

        escalation = wait_for(escalated, 30, "the daemon to escalate the email")
        tools = make_registry(email_url=stack.services["email"].url, timeout_s=TOOL_TIMEOUT_S)
        with Ledger(settings, tools=tools, options=ResumeOptions(grace_s=0.5)) as ledger:
            verdict = ev.EscalationResolved(
                escalation_id=escalation, verdict=Verdict.NOT_HAPPENED, by="ann", note="no mail"
            )
            ledger.log.append(ledger.events.envelope(workflow, "step", verdict))
            wf = ledger.workflow(workflow)
            wf.step("step", tools.require(EMAIL), MAIL)
        assert email.effect_count("email") == before + 1
        os.kill(frozen.pid, signal.SIGCONT)
        out, _ = frozen.communicate(timeout=60)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    assert email.effect_count("email") == before + 1
    answer = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert answer.get("error") == "StepInDoubtError", answer

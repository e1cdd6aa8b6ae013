"""A pause that holds recovery keeps an in-doubt step undecided until its unpause.

Real parts only: the example payments service counting its charges, the example agent
SIGKILLed after its intent (the step in doubt, nothing charged), ``stepledger recover``
subprocesses and ``stepledger workflows pause|unpause`` for the operator.  A plain pause
lets recovery settle the step past its deadline plus the grace, as ever (re-driven: one
charge).  ``pause --hold-recovery`` keeps it undecided past its deadline plus the grace
while a daemon runs, through a SIGKILL of that daemon and a new one taking over; the
unpause lets it be decided at once, once, and the decision names the hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.state import StepState, StepStatus
from stepledger.kafka import ensure_topics
from stepledger_dev.examples.clients import PaymentsClient
from stepledger_dev.examples.tools import PAYMENTS
from tests.conftest import unique
from tests.e2e.recovery_helpers import GRACE_S, LogWatcher, Stack, services_stack, wait_for

pytestmark = pytest.mark.e2e
#: The held step's tool timeout: room for the operator's pause before its deadline.
TIMEOUT_S = 12.0
#: How long past deadline + grace a step must stay undecided to count as held.
HELD_S = 3.0
CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}
CLI = [sys.executable, "-m", "stepledger", "workflows"]


@pytest.fixture
def settings(bootstrap: str) -> Settings:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("hold"),
        dlq_topic=unique("hold-dlq"),
        fleet_id="hold-fleet",
        producer_id="test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    return settings


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with services_stack(tmp_path) as stack:
        yield stack


def operator(stack: Stack, settings: Settings, *args: str) -> str:
    done = subprocess.run(
        [*CLI, *args, "--by", "ops", "--reason", "provider incident"],
        env=stack.env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def in_doubt(stack: Stack, settings: Settings) -> str:
    workflow = "hold-" + uuid.uuid4().hex[:10]
    agent = stack.run_agent(
        settings,
        PAYMENTS,
        workflow,
        "s",
        CHARGE,
        kill="after_intent",
        env={"STEPLEDGER_TOOL_TIMEOUT_S": str(TIMEOUT_S)},
    )
    assert agent.returncode == -9, agent.stderr.read() if agent.stderr else ""
    return workflow


def decided(watcher: LogWatcher, workflow: str) -> StepState | None:
    step = watcher.step(workflow)
    return step if step is not None and not step.in_doubt else None


def charges(stack: Stack, key: str) -> int:
    return PaymentsClient(stack.services["payments"].url).effect_count("charge", key)


def test_a_held_pause_keeps_an_in_doubt_step_undecided_until_its_unpause(
    stack: Stack, settings: Settings, tmp_path: Path
) -> None:
    watcher = LogWatcher(settings)
    try:
        daemon = stack.start_daemon(settings, tmp_path / "state-1")
        # Each paused at once after its crash: well before its deadline, on a busy machine too.
        held = in_doubt(stack, settings)
        out = operator(stack, settings, "pause", held, "--hold-recovery")
        assert f"{held}: paused (pause 1, recovery held)" in out, out
        plain = in_doubt(stack, settings)
        assert f"{plain}: paused (pause 1)" in operator(stack, settings, "pause", plain)
        # The plain pause: recovery settles its step past deadline + grace, as ever.
        budget = TIMEOUT_S + GRACE_S + 15.0
        step = wait_for(lambda: decided(watcher, plain), budget, "the plain pause's step")
        assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.RECOVERY_REDRIVE
        assert charges(stack, step.idempotency_key) == 1
        # The held one was in doubt first: past its deadline + grace, it stays undecided,
        # also once a daemon that took the partition over from a SIGKILLed one runs.
        first = watcher.step(held)
        assert first is not None and first.deadline is not None
        paused = [e for e in watcher.of(held) if isinstance(e.body, ev.WorkflowPaused)]
        assert paused[0].occurred_at < first.deadline, "the pause came after the deadline"
        stays_undecided(stack, watcher, held, first.deadline.timestamp() + GRACE_S + HELD_S)
        daemon.kill()
        daemon.wait(timeout=10)
        stack.daemons.remove(daemon)
        stack.start_daemon(settings, tmp_path / "state-2")
        stays_undecided(stack, watcher, held, time.time() + HELD_S)
        # The unpause: decided at once, once, naming the hold it waited through.
        assert f"{held}: unpaused (pause 1 by ops)" in operator(stack, settings, "unpause", held)
        step = wait_for(lambda: decided(watcher, held), 20.0, "the held step after the unpause")
        assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.RECOVERY_REDRIVE
        assert charges(stack, step.idempotency_key) == 1
        events = watcher.of(held)
        outcomes = [e.body for e in events if isinstance(e.body, ev.StepOutcome)]
        assert len(outcomes) == 1 and outcomes[0].evidence_json is not None
        hold = json.loads(outcomes[0].evidence_json)["recovery_hold"]
        assert hold == "pause 1 by ops: provider incident (unpaused by ops)"
        assert step.resolved_at is not None
        assert (step.resolved_at - first.deadline).total_seconds() > GRACE_S + HELD_S
    finally:
        watcher.close()
        stack.stop_daemons()


def stays_undecided(stack: Stack, watcher: LogWatcher, workflow: str, until: float) -> None:
    """The step is in doubt, nothing charged under its key, until ``until`` (wall clock)."""
    ends = time.monotonic() + max(0.0, until - time.time())
    while True:
        step = watcher.step(workflow)
        assert step is not None and step.in_doubt, step
        assert charges(stack, step.idempotency_key) == 0
        assert all(d.poll() is None for d in stack.daemons), "a recovery daemon exited"
        if time.monotonic() >= ends:
            return
        time.sleep(0.3)

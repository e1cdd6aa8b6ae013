"""A compensation an agent left in doubt is carried through by the recovery daemon, once.

A saga's agent books a hotel (its outcome recorded: the daemon stops tracking the step),
unwinds the saga and is SIGKILLed inside the compensation hook, after its
``compensation_intended`` was acknowledged; nobody resumes the workflow.  The daemon
(``stepledger recover`` subprocess) reads the workflow back, tracks the step again and
cancels the booking once.  A zombie's compensation intent (a runner frozen while another
claimed the workflow and completed the trip) is read the same way and carried through
never: the log's fold fences it off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import ResolutionPolicy, Source
from stepledger.domain.state import RunStatus, StepStatus
from stepledger.kafka import ensure_topics
from stepledger.producer import Ledger, ResumeOptions
from stepledger_dev.examples.clients import BookingsClient
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS, make_registry
from tests.conftest import unique
from tests.e2e.recovery_helpers import (
    GRACE_S,
    TOOL_TIMEOUT_S,
    LogWatcher,
    Stack,
    group_of,
    services_stack,
    wait_for,
)

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
UNWIND = HERE / "agent_unwind.py"
TRIP = HERE.parent / "integration" / "agent_trip.py"
BOOKING = {"hotel": "Hotel Lisboa", "nights": 2}
CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}
#: The compensation's deadline plus the grace, then the read, the hook and the read-back.
BUDGET_S = TOOL_TIMEOUT_S + GRACE_S + 15.0


@pytest.fixture(scope="module")
def carry_settings(bootstrap: str) -> Settings:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("events"),
        dlq_topic=unique("dlq"),
        fleet_id="carry-fleet",
        producer_id="test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    return settings


@pytest.fixture(scope="module")
def daemon_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("carry-log") / "recover.log"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("carry-state")


@pytest.fixture(scope="module")
def stack(
    carry_settings: Settings,
    daemon_log: Path,
    state_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with services_stack(tmp_path_factory.mktemp("carry")) as stack:
        stack.start_daemon(carry_settings, state_dir, log=daemon_log)
        yield stack


class Heartbeat:
    """The daemon's health file: what it has read, and how many steps it tracks."""

    def __init__(self, state_dir: Path, settings: Settings) -> None:
        self.path = state_dir / f"health-{group_of(settings)}.json"

    def read(self) -> dict[str, int]:
        beat: dict[str, int] = json.loads(self.path.read_text())
        return beat

    def let_go(self, watcher: LogWatcher, tracked_before: int) -> None:
        """Wait until the daemon read everything in the log and tracks no more steps than
        before: the step an agent settled since is no longer tracked."""
        written = len(watcher.refresh().events)

        def done() -> bool:
            beat = self.read()
            return beat["events_read"] >= written and beat["tracked_steps"] <= tracked_before

        wait_for(done, 30, "the daemon to let go of the settled booking")


@pytest.fixture(scope="module")
def heartbeat(state_dir: Path, carry_settings: Settings) -> Heartbeat:
    return Heartbeat(state_dir, carry_settings)


@pytest.fixture(scope="module")
def watcher(carry_settings: Settings) -> Iterator[LogWatcher]:
    log = LogWatcher(carry_settings)
    yield log
    log.close()


def bookings(stack: Stack) -> BookingsClient:
    return BookingsClient(stack.services["bookings"].url)


def test_a_compensation_an_agent_left_in_doubt_is_carried_through_once(
    stack: Stack,
    carry_settings: Settings,
    watcher: LogWatcher,
    heartbeat: Heartbeat,
    tmp_path: Path,
) -> None:
    workflow = "wf-" + uuid.uuid4().hex[:10]
    go = tmp_path / "go"
    tracked_before = heartbeat.read()["tracked_steps"]
    agent = subprocess.Popen(
        [sys.executable, str(UNWIND), workflow, "book", json.dumps(BOOKING), str(go)],
        env=stack.env(carry_settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "booked"
        heartbeat.let_go(watcher, tracked_before)
        go.touch()
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
    assert agent.returncode == -signal.SIGKILL, err
    assert not out.strip()  # it died in the hook: nothing more printed
    step = watcher.step(workflow, "book")
    assert step is not None and step.status is StepStatus.COMPENSATING
    key = step.idempotency_key
    assert bookings(stack).effect_count("cancel", key) == 0  # the agent died before the cancel

    def compensated() -> bool:
        found = watcher.step(workflow, "book")
        return found is not None and found.status is StepStatus.COMPENSATED

    wait_for(compensated, BUDGET_S, "the daemon to carry the compensation through")
    assert bookings(stack).effect_count("booking", key) == 1
    assert bookings(stack).effect_count("cancel", key) == 1
    found = bookings(stack).find_booking(key)
    assert found is not None and found["status"] == "cancelled"
    bodies = [e.body for e in watcher.of(workflow)]
    outcomes = [b for b in bodies if isinstance(b, ev.CompensationOutcome)]
    assert [o.source for o in outcomes] == [Source.RECOVERY_COMPENSATE]
    hooks = [
        b
        for b in bodies
        if isinstance(b, ev.ResolutionAttempted) and b.policy is ResolutionPolicy.COMPENSATE
    ]
    assert len(hooks) == 1 and hooks[0].error is None  # the hook ran once
    # Recovery decided nothing new: the agent's claim stood, so no second claim was made.
    claims = [b for b in bodies if isinstance(b, ev.CompensationIntended)]
    assert [c.source for c in claims] == [Source.AGENT]


def test_a_zombies_fenced_compensation_intent_is_not_carried_through(
    stack: Stack,
    carry_settings: Settings,
    watcher: LogWatcher,
    heartbeat: Heartbeat,
    daemon_log: Path,
) -> None:
    settings = carry_settings
    workflow = unique("wf-zombie")
    env = stack.env(settings)
    env["PYTHONPATH"] = f"{HERE.parents[1]}{os.pathsep}{env['PYTHONPATH']}"
    command = [sys.executable, str(TRIP), settings.bootstrap, settings.topic, workflow]
    tracked_before = heartbeat.read()["tracked_steps"]
    frozen = subprocess.Popen([*command, "compensate"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert frozen.stdout is not None and frozen.stdout.readline().strip() == "booked"
        wait_for(lambda: _stopped(frozen), 30, "the runner froze before its compensation")
        heartbeat.let_go(watcher, tracked_before)
        urls = {kind: s.url for kind, s in stack.services.items()}
        tools = make_registry(
            urls["payments"], urls["bookings"], urls["email"], timeout_s=TOOL_TIMEOUT_S
        )
        options = ResumeOptions(grace_s=GRACE_S, resolve_timeout_s=30)
        with Ledger(settings, tools=tools, options=options) as ledger:
            wf = ledger.workflow(workflow)  # claims the next attempt
            wf.step("book", tools.require(BOOKINGS), BOOKING)  # replayed, not called again
            wf.step("charge", tools.require(PAYMENTS), CHARGE)
            wf.finish()
            key = wf.state.steps["book"].idempotency_key
        os.kill(frozen.pid, signal.SIGCONT)
        out, _ = frozen.communicate(timeout=60)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    answer = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert answer.get("error") == "WorkflowTakenOverError", answer

    def judged() -> bool:
        # The daemon read the workflow back once the zombie's claim was past its deadline and
        # let the step go (or, wrongly, resolved it: the assertions below then fail).
        return any(
            line.get("workflow_id") == workflow and line.get("step_id") == "book"
            for line in _json_lines(daemon_log)
            if str(line.get("message", "")).startswith(("not tracked", "step resolved"))
        )

    wait_for(judged, BUDGET_S, "the daemon to judge the zombie's compensation intent")
    state = watcher.refresh().states[workflow]
    assert state.status is RunStatus.COMPLETED
    assert state.steps["book"].status is StepStatus.SUCCEEDED
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]
    assert bookings(stack).effect_count("cancel", key) == 0
    found = bookings(stack).find_booking(key)
    assert found is not None and found["status"] == "confirmed"
    bodies = [e.body for e in watcher.of(workflow)]
    assert not [b for b in bodies if isinstance(b, ev.CompensationOutcome)]


def _json_lines(path: Path) -> list[dict[str, object]]:
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the daemon still writing it
    return found


def _stopped(proc: subprocess.Popen[str]) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"

"""A recovery daemon restarted past a workflow's latest claim decides nothing on a zombie's intent.

Found by the simulator (``stepledger simulate``), replayed here with real processes on
Apache Kafka: runner A opens a trip and freezes (SIGSTOP) before it books; runner B claims
the workflow, books the hotel and finishes the trip.  The ``stepledger recover`` daemon
checkpoints past B's claim (no step of the trip is tracked then: B settled its booking) and
is SIGKILLed, then restarted from that checkpoint.  A wakes and writes its intent for the
booking: the log fences it off (``zombie_intent``) and A calls nothing.  The restarted
daemon, which never read B's claim, once tracked that intent as live and compensated it
past its deadline: the booking of the trip B completed was cancelled.  Now it holds the
intent until it has read the workflow back, and the log's fold leaves it nothing to decide.
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
from stepledger.domain.enums import Source
from stepledger.domain.state import RunStatus, StepStatus
from stepledger.errors import StepLedgerError
from stepledger.kafka import topic_partitions
from stepledger.producer import Ledger, ResumeOptions
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger_dev.examples.clients import BookingsClient
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS, make_registry
from tests.conftest import Factory, unique
from tests.e2e.recovery_helpers import (
    GRACE_S,
    TOOL_TIMEOUT_S,
    LogWatcher,
    Stack,
    group_of,
    services_stack,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka_only]
HERE = Path(__file__).resolve().parent
TRIP = HERE.parent / "integration" / "agent_trip.py"
BOOKING = {"hotel": "Hotel Lisboa", "nights": 2}
CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}
#: The intent's deadline plus the grace, then the read back and its judgement.
BUDGET_S = TOOL_TIMEOUT_S + GRACE_S + 20.0


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with services_stack(tmp_path_factory.mktemp("restart-claims")) as stack:
        yield stack


def checkpointed(settings: Settings) -> tuple[int, int]:
    """The daemon's checkpoint of partition 0 on the changelog: its position and step count."""
    store = KafkaCheckpointStore(settings, group_of(settings))
    try:
        found = store.load(settings.topic, 0)
    except StepLedgerError:
        return -1, -1  # the daemon has not made its changelog yet
    finally:
        store.close()
    return (-1, -1) if found is None else (found.next_offset, len(found.steps))


def test_a_restarted_daemon_cancels_nothing_for_a_zombies_fenced_intent(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    assert topic_partitions(settings, settings.topic) == [0]
    state, log = tmp_path / "state", tmp_path / "recover.log"
    first = stack.start_daemon(settings, state, log=log)
    workflow = unique("wf-trip")
    env = stack.env(settings)
    env["PYTHONPATH"] = f"{HERE.parents[1]}{os.pathsep}{env['PYTHONPATH']}"
    command = [sys.executable, str(TRIP), settings.bootstrap, settings.topic, workflow, "book"]
    zombie = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    watcher = LogWatcher(settings)
    try:
        assert zombie.stdout is not None and zombie.stdout.readline().strip() == "opened"
        wait_for(lambda: _stopped(zombie), 30, "runner A to freeze before its booking")
        key = _completed_by_b(stack, settings, workflow)
        end = len(watcher.refresh().events)  # one partition, every record an event

        def past_b() -> bool:
            position, steps = checkpointed(settings)
            return position >= end and steps == 0

        wait_for(past_b, 30, "a checkpoint past B's claim, with nothing of the trip tracked")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        stack.daemons.remove(first)
        stack.start_daemon(settings, state, log=log)  # from the checkpoint it left
        os.kill(zombie.pid, signal.SIGCONT)
        out, _ = zombie.communicate(timeout=60)
        answer = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        assert answer.get("error") == "WorkflowTakenOverError", answer
        booked = [e.body for e in watcher.of(workflow) if e.step_id == "book"]
        epochs = [b.epoch for b in booked if isinstance(b, ev.StepIntended)]
        assert epochs == [2, 1]  # B's booking, then A's zombie intent
        wait_for(lambda: _judged(log, workflow), BUDGET_S, "the daemon to judge A's intent")
        state_now = watcher.refresh().states[workflow]
        bodies = [e.body for e in watcher.of(workflow)]
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait(10)
        watcher.close()
    client = BookingsClient(stack.services["bookings"].url)
    assert client.effect_count("booking", key) == 1
    assert client.effect_count("cancel", key) == 0
    found = client.find_booking(key)
    assert found is not None and found["status"] == "confirmed"
    assert state_now.status is RunStatus.COMPLETED
    assert state_now.steps["book"].status is StepStatus.SUCCEEDED
    assert [a.kind for a in state_now.anomalies] == ["zombie_intent"]
    # Recovery decided nothing on the trip: no claim, no attempt, no outcome of its own.
    assert not [b for b in bodies if isinstance(b, ev.CompensationIntended)]
    assert not [b for b in bodies if isinstance(b, ev.ResolutionAttempted)]
    sources = [b.source for b in bodies if isinstance(b, ev.StepOutcome)]
    assert sources and all(s is Source.AGENT for s in sources)


def _completed_by_b(stack: Stack, settings: Settings, workflow: str) -> str:
    """Runner B claims the workflow, books, charges and finishes: the booking's key."""
    urls = {kind: s.url for kind, s in stack.services.items()}
    tools = make_registry(
        urls["payments"], urls["bookings"], urls["email"], timeout_s=TOOL_TIMEOUT_S
    )
    options = ResumeOptions(grace_s=GRACE_S, resolve_timeout_s=30)
    with Ledger(settings, tools=tools, options=options) as ledger:
        wf = ledger.workflow(workflow)  # claims the next attempt: A is fenced off
        wf.step("book", tools.require(BOOKINGS), BOOKING)
        wf.step("charge", tools.require(PAYMENTS), CHARGE)
        wf.finish()
        return wf.state.steps["book"].idempotency_key


def _judged(log: Path, workflow: str) -> bool:
    """The daemon read the workflow back and let A's intent go (or, wrongly, resolved it)."""
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the daemon still writing it
        message = str(record.get("message", ""))
        mine = record.get("workflow_id") == workflow and record.get("step_id") == "book"
        if mine and message.startswith(("not tracked", "step resolved")):
            return True
    return False


def _stopped(proc: subprocess.Popen[str]) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"

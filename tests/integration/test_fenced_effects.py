"""Every effect a runner makes is fenced: its saga's compensations and its keyed calls too.

A trip runner books a hotel and stops itself (SIGSTOP) right before its next effect; another
runner claims the workflow and ends the trip; the first is continued.  The services count
their own effects: the frozen runner's compensation cancels nothing of a trip the new owner
completed, and its keyed charge charges nothing for a trip the new owner compensated.  Its
claim stays in the log as an anomaly that decides nothing, and it is told in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.state import RunStatus, StepStatus, WorkflowState, replay
from stepledger.errors import WorkflowDeadLetteredError
from stepledger.history.kafka import KafkaHistory
from stepledger.producer import Ledger, ResumeOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.clients import BookingsClient, RunningService
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS, make_registry
from tests.conftest import Factory, unique
from tests.integration.agent_trip import BOOKING, CHARGE
from tests.integration.test_runners import (
    TIMEOUT_S,
    URL_ENV,
    effects,
    last_answer,
    read_line,
    services,
    stopped,
    wait_for,
)

__all__ = ["services"]  # the module's services fixture, shared with test_runners

TRIP = Path(__file__).with_name("agent_trip.py")


def spawn_trip(
    settings: Settings,
    running: dict[str, RunningService],
    src_env: dict[str, str],
    mode: str,
    workflow: str | None = None,
) -> tuple[subprocess.Popen[str], str]:
    workflow = workflow or unique(f"wf-trip-{mode}")
    env = {**src_env, "STEPLEDGER_TOOL_TIMEOUT_S": str(TIMEOUT_S)}
    env.update({URL_ENV[kind]: s.url for kind, s in running.items()})
    env["PYTHONPATH"] = f"{Path(__file__).resolve().parents[2]}{os.pathsep}{env['PYTHONPATH']}"
    command = [sys.executable, str(TRIP), settings.bootstrap, settings.topic, workflow, mode]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env), workflow


def owner(settings: Settings, running: dict[str, RunningService]) -> tuple[Ledger, ToolRegistry]:
    urls = {kind: s.url for kind, s in running.items()}
    tools = make_registry(urls["payments"], urls["bookings"], urls["email"], timeout_s=TIMEOUT_S)
    options = ResumeOptions(grace_s=0.3, resolve_timeout_s=30)
    return Ledger(settings, tools=tools, options=options), tools


def logged(settings: Settings, workflow: str) -> tuple[list[ev.Event], WorkflowState]:
    reader = KafkaHistory(settings)
    try:
        events = reader.read(workflow).events
    finally:
        reader.close()
    return events, replay(workflow, events)


def woken(frozen: subprocess.Popen[str]) -> dict[str, object]:
    os.kill(frozen.pid, signal.SIGCONT)
    return last_answer(frozen, 60)


def test_a_frozen_runner_cancels_nothing_of_a_trip_another_runner_completed(
    make_settings: Factory, services: dict[str, RunningService], src_env: dict[str, str]
) -> None:
    settings = make_settings()
    frozen, workflow = spawn_trip(settings, services, src_env, "compensate")
    try:
        assert read_line(frozen, 60) == "booked"
        wait_for(lambda: stopped(frozen), 30, "the runner froze before its compensation")
        ledger, tools = owner(settings, services)
        with ledger:
            wf = ledger.workflow(workflow)  # claims the next attempt
            wf.step("book", tools.require(BOOKINGS), BOOKING)  # replayed, not called again
            wf.step("charge", tools.require(PAYMENTS), CHARGE)
            wf.finish()
            key = wf.state.steps["book"].idempotency_key
        answer = woken(frozen)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    assert answer.get("error") == "WorkflowTakenOverError", answer
    message = str(answer["message"])
    assert "nothing was called" in message and "\n" not in message
    assert effects(services, BOOKINGS, key) == 1
    assert BookingsClient(services["bookings"].url).effect_count("cancel", key) == 0
    found = BookingsClient(services["bookings"].url).find_booking(key)
    assert found is not None and found["status"] == "confirmed"
    events, state = logged(settings, workflow)
    assert state.status is RunStatus.COMPLETED
    assert state.steps["book"].status is StepStatus.SUCCEEDED
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]
    claims = [e.body for e in events if isinstance(e.body, ev.CompensationIntended)]
    assert len(claims) == 1 and claims[0].epoch == 1 and claims[0].runner


def test_a_frozen_runner_charges_nothing_for_a_trip_another_runner_compensated(
    make_settings: Factory, services: dict[str, RunningService], src_env: dict[str, str]
) -> None:
    settings = make_settings()
    charges = effects(services, PAYMENTS)
    frozen, workflow = spawn_trip(settings, services, src_env, "charge")
    try:
        assert read_line(frozen, 60) == "booked"
        wait_for(lambda: stopped(frozen), 30, "the runner froze before its charge")
        ledger, _ = owner(settings, services)
        with ledger:
            wf = ledger.workflow(workflow)  # claims the next attempt
            assert wf.compensate("the trip was called off") == ["book"]
            assert wf.state.status is RunStatus.COMPENSATED
        answer = woken(frozen)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    assert answer.get("error") == "WorkflowTakenOverError", answer
    message = str(answer["message"])
    assert "nothing was called" in message and "\n" not in message
    events, state = logged(settings, workflow)
    intents = [e.body for e in events if isinstance(e.body, ev.StepIntended)]
    zombie = [i for i in intents if i.tool == PAYMENTS]
    assert len(zombie) == 1 and zombie[0].epoch == 1
    assert effects(services, PAYMENTS, zombie[0].idempotency_key) == 0
    assert effects(services, PAYMENTS) == charges
    assert state.status is RunStatus.COMPENSATED and "charge" not in state.steps
    assert [a.kind for a in state.anomalies] == ["zombie_intent"]


def test_a_frozen_owner_cancels_nothing_once_a_resume_past_the_limit_dead_lettered_it(
    make_settings: Factory, services: dict[str, RunningService], src_env: dict[str, str]
) -> None:
    # Found by the simulator: the dead letter was written with no claim, so the owner, alive
    # and slow, went on unwinding its saga after the workflow ended.
    settings = make_settings()
    workflow = unique("wf-trip-limit")
    ledger, _ = owner(settings, services)
    with ledger:
        ledger.workflow(workflow, name="trip", max_attempts=2)  # attempt 1 of 2
    frozen, _ = spawn_trip(settings, services, src_env, "compensate", workflow)  # attempt 2
    try:
        assert read_line(frozen, 60) == "booked"
        wait_for(lambda: stopped(frozen), 30, "the runner froze before its compensation")
        ledger, _ = owner(settings, services)
        with ledger, pytest.raises(WorkflowDeadLetteredError):
            ledger.workflow(workflow)  # attempt 3 is past the limit
        answer = woken(frozen)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    assert answer.get("error") == "WorkflowTakenOverError", answer
    events, state = logged(settings, workflow)
    key = state.steps["book"].idempotency_key
    assert effects(services, BOOKINGS, key) == 1
    assert BookingsClient(services["bookings"].url).effect_count("cancel", key) == 0
    assert state.status is RunStatus.DEAD_LETTERED and state.attempt == 3
    assert [e.type for e in events][-3:] == [
        "workflow_resumed",
        "workflow_dead_lettered",
        "compensation_intended",
    ]
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]

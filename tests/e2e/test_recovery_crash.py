"""Agents SIGKILLed between intent and outcome; the recovery daemon resolves every policy.

One daemon (``stepledger recover`` subprocess) and the three example services serve the
module; each test runs its own workflows through the example agent process.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import CompensationStatus, Source
from stepledger.domain.state import StepState, StepStatus
from stepledger.kafka import ensure_topics
from stepledger_dev.examples.clients import start_service
from stepledger_dev.examples.tools import BOOKINGS, EMAIL, PAYMENTS
from tests.conftest import unique
from tests.e2e.recovery_helpers import (
    GRACE_S,
    TOOL_TIMEOUT_S,
    LogWatcher,
    Stack,
    run_cli,
    wait_for,
)

pytestmark = pytest.mark.e2e
#: Resolution must land within deadline + grace + this many seconds.
SLACK_S = 4.0
#: A call that ends after recovery decided: past the latest decision the tests allow.
LATE_S = TOOL_TIMEOUT_S + GRACE_S + SLACK_S + 1.5
CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}
BOOKING = {"hotel": "Hotel Lisboa", "nights": 2}
MAIL = {"to": "ana@example.com", "subject": "receipt", "body": "thanks"}


@pytest.fixture(scope="module")
def module_settings(bootstrap: str) -> Settings:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("events"),
        dlq_topic=unique("dlq"),
        fleet_id="crash-fleet",
        producer_id="test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    return settings


@pytest.fixture(scope="module")
def stack(module_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import os

    base = tmp_path_factory.mktemp("recovery-crash")
    services = {
        kind: start_service(kind, base / f"{kind}.sqlite")
        for kind in ("payments", "bookings", "email")
    }
    stack = Stack(services, dict(os.environ))
    try:
        stack.start_daemon(module_settings, base / "state")
        yield stack
    finally:
        stack.stop_daemons()
        for service in services.values():
            service.stop()


@pytest.fixture(scope="module")
def watcher(module_settings: Settings) -> Iterator[LogWatcher]:
    log = LogWatcher(module_settings)
    yield log
    log.close()


def new_id() -> str:
    return "wf-" + uuid.uuid4().hex[:10]


def resolved(watcher: LogWatcher, workflow: str, step: str = "s") -> StepState:
    """Wait until the step is no longer in doubt, within deadline + grace + slack."""
    budget = TOOL_TIMEOUT_S + GRACE_S + SLACK_S

    def check() -> StepState | None:
        state = watcher.step(workflow, step)
        if state is None or state.in_doubt or state.status is StepStatus.COMPENSATING:
            return None
        return state

    return wait_for(check, budget + 3.0, f"{workflow} to be resolved")


def crash(stack: Stack, settings: Settings, tool: str, args: dict[str, Any], kill: str) -> str:
    workflow = new_id()
    agent = stack.run_agent(settings, tool, workflow, "s", args, kill=kill)
    assert agent.returncode == -9, agent.stderr.read() if agent.stderr else ""
    return workflow


def effects(stack: Stack, kind: str, service: str, key: str | None = None) -> int:
    from stepledger_dev.examples.clients import _JsonClient

    return _JsonClient(stack.services[service].url).effect_count(kind, key)


@pytest.mark.parametrize(
    ("kill", "source"),
    [("after_intent", Source.RECOVERY_REDRIVE), ("after_effect", Source.RECOVERY_QUERY)],
)
def test_query_tool_is_resolved_with_exactly_one_effect(
    stack: Stack, module_settings: Settings, watcher: LogWatcher, kill: str, source: Source
) -> None:
    workflow = crash(stack, module_settings, PAYMENTS, CHARGE, kill)
    step = resolved(watcher, workflow)
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is source
    assert effects(stack, "charge", "payments", step.idempotency_key) == 1
    assert step.resolved_at is not None and step.deadline is not None
    latency = (step.resolved_at - step.deadline).total_seconds()
    assert GRACE_S - 0.1 <= latency <= GRACE_S + SLACK_S


@pytest.mark.parametrize(
    ("kill", "compensation", "bookings", "cancels"),
    [
        ("after_intent", CompensationStatus.NOTHING_TO_UNDO, 0, 0),
        ("after_effect", CompensationStatus.SUCCEEDED, 1, 1),
    ],
)
def test_compensate_tool_is_compensated_once_or_found_nothing_to_undo(
    stack: Stack,
    module_settings: Settings,
    watcher: LogWatcher,
    kill: str,
    compensation: CompensationStatus,
    bookings: int,
    cancels: int,
) -> None:
    workflow = crash(stack, module_settings, BOOKINGS, BOOKING, kill)
    step = resolved(watcher, workflow)
    assert step.status is StepStatus.COMPENSATED
    assert effects(stack, "booking", "bookings", step.idempotency_key) == bookings
    assert effects(stack, "cancel", "bookings", step.idempotency_key) == cancels
    outcomes = [e.body for e in watcher.of(workflow) if isinstance(e.body, ev.CompensationOutcome)]
    assert [o.status for o in outcomes] == [compensation]


@pytest.mark.parametrize("kill", ["after_intent", "after_effect"])
def test_irreversible_step_is_escalated_and_a_cli_answer_rejudges_it(
    stack: Stack, module_settings: Settings, watcher: LogWatcher, kill: str
) -> None:
    workflow = crash(stack, module_settings, EMAIL, MAIL, kill)
    step = resolved(watcher, workflow)
    assert step.status is StepStatus.ABANDONED and step.escalation_open
    env = stack.env(module_settings)
    listed = run_cli(env, "escalations", "list", "--json", "--tool", EMAIL)
    assert listed.returncode == 0, listed.stderr
    mine = [json.loads(line) for line in listed.stdout.splitlines()]
    [item] = [i for i in mine if i["workflow_id"] == workflow]
    assert item["escalation_id"] == step.escalation_id and item["arguments"] == MAIL
    shown = run_cli(env, "escalations", "show", item["escalation_id"])
    assert shown.returncode == 0 and '"options"' in shown.stdout
    verdict = "--happened" if kill == "after_effect" else "--not-happened"
    answer = run_cli(
        env,
        "escalations",
        "resolve",
        item["escalation_id"],
        verdict,
        "--note",
        "checked the mail log",
        "--by",
        "ana",
    )
    assert answer.returncode == 0, answer.stderr
    final = watcher.step(workflow)
    assert final is not None and not final.escalation_open
    expected = StepStatus.SUCCEEDED if kill == "after_effect" else StepStatus.NOT_HAPPENED
    assert final.status is expected and final.resolved_by is Source.HUMAN
    again = run_cli(env, "escalations", "resolve", item["escalation_id"], "--happened", "--by", "x")
    assert again.returncode == 1 and "no open escalation" in again.stderr


def test_slow_agent_late_outcome_is_recorded_as_superseded(
    stack: Stack, module_settings: Settings, watcher: LogWatcher
) -> None:
    workflow = new_id()
    agent = stack.run_agent(
        module_settings, PAYMENTS, workflow, "s", CHARGE, slow=LATE_S, wait=False
    )
    step = resolved(watcher, workflow)
    assert step.resolved_by is Source.RECOVERY_QUERY and step.status is StepStatus.SUCCEEDED
    assert agent.wait(timeout=30) == 0

    def superseded() -> list[ev.AnomalyObserved]:
        return [e.body for e in watcher.of(workflow) if isinstance(e.body, ev.AnomalyObserved)]

    [anomaly] = wait_for(superseded, 10, "the late outcome to be judged")
    assert anomaly.kind == "late_outcome_superseded" and anomaly.source is Source.RECOVERY
    final = watcher.step(workflow)
    assert final is not None and final.resolved_by is Source.RECOVERY_QUERY
    assert effects(stack, "charge", "payments", final.idempotency_key) == 1


def test_late_effect_after_compensation_conflicts_and_escalates(
    stack: Stack, module_settings: Settings, watcher: LogWatcher, tmp_path: Path
) -> None:
    # The service itself is slow: the booking lands after recovery found nothing to undo (a
    # service that does not remember undone keys: the example services refuse such a late
    # call unless asked to ignore the void, see test_example_services).
    workflow = new_id()
    agent = stack.run_agent(
        module_settings,
        BOOKINGS,
        workflow,
        "s",
        BOOKING,
        fault=f"delay={LATE_S},ignore-void",
        wait=False,
    )
    step = resolved(watcher, workflow)
    assert step.status is StepStatus.COMPENSATED
    # The call ended past its deadline: the agent reads the log and follows its decision.
    assert agent.wait(timeout=30) == 3
    assert agent.stdout is not None
    report = json.loads(agent.stdout.read())
    assert report == {"error": "StepCompensatedError", "decision": "compensated"}

    def escalated() -> StepState | None:
        state = watcher.step(workflow)
        return state if state is not None and state.escalation_open else None

    step = wait_for(escalated, 10, "the conflict to open an escalation")
    assert step.status is StepStatus.COMPENSATED  # the first decision stands meanwhile
    assert effects(stack, "booking", "bookings", step.idempotency_key) == 1
    env = stack.env(module_settings)
    shown = json.loads(run_cli(env, "escalations", "show", str(step.escalation_id)).stdout)
    assert shown["reason"].startswith("conflicting_late_outcome")
    assert any(a["kind"] == "conflicting_late_outcome" for a in shown["anomalies"])
    answer = run_cli(
        env,
        "escalations",
        "resolve",
        str(step.escalation_id),
        "--happened",
        "--result",
        '{"booking": "kept"}',
        "--by",
        "ana",
    )
    assert answer.returncode == 0, answer.stderr
    final = watcher.step(workflow)
    assert final is not None and final.status is StepStatus.SUCCEEDED
    assert final.result_json == '{"booking": "kept"}'

"""Agents built with a framework, SIGKILLed right after an effect, then resumed.

Each framework's own offline model, scripted (charge -> book -> email -> answer), tools
from the example services that count their effects, the agent as a subprocess that kills
itself, the recovery daemon where the case needs it, and the human's answer through the CLI.
Every effect happens once or is undone, and no recorded model turn is asked again.
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

from stepledger.config import Settings
from stepledger.domain.ids import idempotency_key
from stepledger.domain.state import RunStatus, StepStatus
from stepledger_dev.examples.clients import BookingsClient, PaymentsClient
from stepledger_dev.examples.tools import BOOKINGS, EMAIL, PAYMENTS
from tests.e2e.recovery_helpers import (
    LogWatcher,
    Stack,
    run_cli,
    services_stack,
    wait_for,
)
from tests.integration.projector_helpers import projecting, query_one

pytestmark = pytest.mark.e2e
FRAMEWORKS = ["openai-agents", "pydantic-ai", "langgraph"]
AGENT = [sys.executable, "-m", "tests.e2e.framework_agent"]


@dataclass
class Trip:
    """One framework's trip agent over the services and a fresh topic."""

    framework: str
    stack: Stack
    settings: Settings
    model_log: Path

    def run(
        self,
        workflow: str,
        kill_after: str | None = None,
        *,
        kill_when: str = "effect",
        reword: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        command = [*AGENT, self.framework, workflow]
        if kill_after:
            command += ["--kill-after", kill_after, "--kill-when", kill_when]
        env = self.stack.env(
            self.settings,
            FRAMEWORK_MODEL_LOG=str(self.model_log),
            FRAMEWORK_REWORD="1" if reword else "0",
        )
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        return proc.returncode, (lines[-1] if lines else {})

    def model_turns(self) -> list[int]:
        """Every real model call, in order (a turn asked twice appears twice)."""
        if not self.model_log.exists():
            return []
        return [json.loads(line)["turn"] for line in self.model_log.read_text().splitlines()]

    def effects(self, workflow: str) -> dict[str, int]:
        payments = PaymentsClient(self.stack.services["payments"].url)
        bookings = BookingsClient(self.stack.services["bookings"].url)
        charge = idempotency_key(workflow, f"{PAYMENTS}#1", PAYMENTS)
        book = idempotency_key(workflow, f"{BOOKINGS}#1", BOOKINGS)
        return {
            "charge": _count(payments.effects(), "charge", charge),
            "refund": _count(payments.effects(), "refund", ""),
            "booking": _count(bookings.effects(), "booking", book),
            "cancel": _count(bookings.effects(), "cancel", book),
            "email": emails_in(self.stack.services["email"].state_path, f"{workflow}@example.test"),
        }


def projected(trip: Trip, workflow: str, db: Path) -> tuple[str, dict[str, str]]:
    """The workflow's status and step statuses as the DuckDB projection has them."""
    events = len(LogWatcher(trip.settings).refresh().events)
    with projecting(trip.settings, db) as projector:
        projector.wait_received(events)
    sql = "SELECT step_id, status FROM steps WHERE workflow_id = ? AND tool <> 'model'"
    steps = dict(query_one(db, sql, [workflow]))
    (status,) = query_one(db, "SELECT status FROM workflows WHERE workflow_id = ?", [workflow])[0]
    return status, steps


def emails_in(path: Path, address: str) -> int:
    """Emails the email service sent to ``address`` (it has no key to count by)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT body FROM records WHERE kind = 'email'").fetchall()
    return sum(1 for (body,) in rows if json.loads(body)["to"] == address)


def _count(effects: dict[str, Any], kind: str, prefix: str) -> int:
    return sum(n for key, n in effects["by_kind"].get(kind, {}).items() if key.startswith(prefix))


@pytest.fixture(params=FRAMEWORKS)
def trip(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Trip]:
    with services_stack(tmp_path) as stack:
        yield Trip(str(request.param), stack, settings, tmp_path / "model-calls.jsonl")


def test_killed_after_a_keyed_charge_resumes_and_charges_once(trip: Trip) -> None:
    code, _ = trip.run("t-charge", kill_after=PAYMENTS)
    assert code == -9
    assert trip.model_turns() == [0]
    code, report = trip.run("t-charge")
    assert code == 0 and report["status"] == "completed", report
    assert "trip booked" in report["answer"]
    assert trip.effects("t-charge") == {
        "charge": 1,
        "refund": 0,
        "booking": 1,
        "cancel": 0,
        "email": 1,
    }
    assert trip.model_turns() == [0, 1, 2, 3], "the recorded turn was not asked again"
    state = LogWatcher(trip.settings).refresh().states["t-charge"]
    assert state.status is RunStatus.COMPLETED
    assert state.steps[f"{PAYMENTS}#1"].status is StepStatus.SUCCEEDED


@pytest.mark.parametrize("kill_when", ["intent", "effect"])
def test_a_resume_whose_model_rewords_the_memo_charges_once(trip: Trip, kill_when: str) -> None:
    code, _ = trip.run("t-memo", kill_after=PAYMENTS, kill_when=kill_when)
    assert code == -9
    # The prompt now carries the time: the recorded turn does not match, the model is
    # asked again and words the charge's memo (and the email's body) its own way.
    code, report = trip.run("t-memo", reword=True)
    assert code == 0 and report["status"] == "completed", report
    assert trip.model_turns() == [0, 0, 1, 2, 3], "asked again from the first turn"
    payments = PaymentsClient(trip.stack.services["payments"].url)
    assert _count(payments.effects(), "charge", "") == 1, "the re-worded charge was not made anew"
    assert trip.effects("t-memo")["charge"] == 1 and trip.effects("t-memo")["email"] == 1
    state = LogWatcher(trip.settings).refresh().states["t-memo"]
    charges = [s for s in state.steps.values() if s.tool == PAYMENTS]
    assert [(s.step_id, s.status) for s in charges] == [(f"{PAYMENTS}#1", StepStatus.SUCCEEDED)]


def test_a_booking_recovery_compensated_is_not_booked_again(trip: Trip, tmp_path: Path) -> None:
    trip.stack.start_daemon(trip.settings, tmp_path / "recovery")
    code, _ = trip.run("t-book", kill_after=BOOKINGS)
    assert code == -9
    watcher = LogWatcher(trip.settings)
    wait_for(
        lambda: (
            (s := watcher.step("t-book", f"{BOOKINGS}#1")) is not None
            and s.status is StepStatus.COMPENSATED
        ),
        30,
        "recovery to compensate the booking",
    )
    code, report = trip.run("t-book")
    assert code == 0 and report["status"] == "compensated", report
    assert report["step"] == f"{BOOKINGS}#1" and report["undone"] == [f"{PAYMENTS}#1"]
    assert trip.effects("t-book") == {
        "charge": 1,
        "refund": 1,
        "booking": 1,
        "cancel": 1,
        "email": 0,
    }
    assert trip.model_turns() == [0, 1], "no turn asked again, none after the undone booking"
    assert watcher.refresh().states["t-book"].status is RunStatus.COMPENSATED
    watcher.close()
    # The projection agrees with the services (checked on the richest case, to keep CI short).
    assert projected(trip, "t-book", tmp_path / "p.duckdb") == (
        "compensated",
        {f"{PAYMENTS}#1": "compensated", f"{BOOKINGS}#1": "compensated"},
    )


def test_an_unkeyed_email_is_escalated_answered_and_finished(trip: Trip) -> None:
    code, _ = trip.run("t-mail", kill_after=EMAIL)
    assert code == -9
    code, report = trip.run("t-mail")
    assert code == 3 and report["status"] == "escalated", report
    env = trip.stack.env(trip.settings)
    answer = run_cli(
        env, "escalations", "resolve", report["escalation_id"], "--happened", "--by", "qa"
    )
    assert answer.returncode == 0, answer.stderr
    code, report = trip.run("t-mail")
    assert code == 0 and report["status"] == "completed", report
    assert trip.effects("t-mail") == {
        "charge": 1,
        "refund": 0,
        "booking": 1,
        "cancel": 0,
        "email": 1,
    }
    assert trip.model_turns() == [0, 1, 2, 3]

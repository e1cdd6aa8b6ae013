"""The saga rules and the new workflow statuses against the real broker (and DuckDB).

Each test runs a workflow through a Kafka-backed ledger with counting in-memory tools, then
reads the topic back (and projects it with ``rebuild``) to check what was recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import Verdict
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import NotFound, Tool
from stepledger.errors import SagaViolationError
from stepledger.humanqueue.escalations import EscalationQueue, answer
from stepledger.kafka.reader import read_topic
from stepledger.producer import Ledger
from stepledger.projector.rebuild import rebuild


class Counted:
    """Keyed charges with refunds, unkeyed emails, counted as a service would."""

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.charges: dict[str, str] = {}

    def charge(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        if key not in self.charges:
            self.effects["charge"] += 1
            self.charges[key] = "captured"
        return {"charge": key}

    def refund(self, args: dict[str, Any], key: str, known: Any) -> Any:
        if key not in self.charges:
            return NotFound("nothing to undo")
        if self.charges[key] != "refunded":
            self.effects["refund"] += 1
            self.charges[key] = "refunded"
        return {"refunded": key}

    def email(self, args: dict[str, Any], key: str) -> str:
        self.effects["email"] += 1
        return "sent"

    def tools(self) -> tuple[Tool, Tool, Tool]:
        charge = Tool(name="charge", keyed=True, run=self.charge, compensate=self.refund)
        email = Tool(name="email", run=self.email, correction="send a correction email")
        notify = Tool(name="notify", keyed=True, run=lambda a, k: "ok")
        return charge, email, notify


def events_of(settings: Settings, workflow_id: str) -> list[ev.Event]:
    records = read_topic(settings, Codec(), idle_timeout=0.3)
    return [r.event for r in records if r.event is not None and r.event.workflow_id == workflow_id]


def test_a_plan_that_breaks_the_pivot_rules_records_nothing(settings: Settings) -> None:
    _, email, _ = Counted().tools()
    undoable = Tool(name="book", compensate=lambda a, k, r: None)
    with Ledger(settings) as ledger, pytest.raises(SagaViolationError) as raised:
        ledger.workflow("wf-plan", plan=[("email", email), ("book", undoable)])
    assert "undoable_after_pivot" in str(raised.value)
    assert events_of(settings, "wf-plan") == []


def test_after_the_pivot_steps_run_forward_and_their_intents_say_so(
    settings: Settings,
) -> None:
    svc = Counted()
    charge, email, notify = svc.tools()
    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-run")
        wf.step("charge", charge, {"amount": 5})
        wf.step("email", email, {"to": "x"})
        wf.step("notify", notify, {})
        wf.step("again", email, {"to": "y"})  # unrepeatable after the pivot: runs once
        with pytest.raises(SagaViolationError, match="pivot_passed") as refused:
            wf.step("charge-2", charge, {"amount": 1})
    events = events_of(settings, "wf-run")
    intents = {e.step_id: e.body for e in events if isinstance(e.body, ev.StepIntended)}
    assert set(intents) == {"charge", "email", "notify", "again"}
    assert [intents[s].after_pivot for s in ("charge", "email", "notify", "again")] == [
        False,
        False,
        True,
        True,
    ]
    charge_intent = intents["charge"]
    assert isinstance(charge_intent, ev.StepIntended)
    assert charge_intent.repeatable and charge_intent.undoable
    assert svc.effects == Counter({"charge": 1, "email": 2})
    # The refusal is in the log for a person, before the refused step's intent.
    [case] = EscalationQueue().extend(events).open()
    assert case.escalation_id == refused.value.escalation_id and "pivot_passed" in case.reason
    assert replay("wf-run", events).status is RunStatus.DEAD_LETTERED


def test_recovery_redrives_an_in_doubt_step_after_the_pivot_instead_of_undoing_it(
    settings: Settings,
) -> None:
    svc = Counted()
    _, email, _ = svc.tools()
    late = Tool(name="late", keyed=True, policy="compensate", run=svc.charge, compensate=svc.refund)
    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-late")
        wf.step("email", email, {"to": "x"})
        wf.record(ledger.events.intent("wf-late", "late", late, {}, sequence=1, after_pivot=True))
    step = replay("wf-late", events_of(settings, "wf-late")).steps["late"]
    assert step.after_pivot and step.policy is not None and step.policy.value == "compensate"
    due = (step.deadline or ledger.clock()) + timedelta(minutes=1)
    assert rs.decide(step, late, now=due).kind is rs.ActionKind.REDRIVE


def test_compensation_incomplete_is_recorded_projected_and_answered(
    settings: Settings, tmp_path: Path
) -> None:
    svc = Counted()
    charge, email, _ = svc.tools()
    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-unwind")
        wf.step("charge", charge, {"amount": 5})
        wf.step("email", email, {"to": "x"})
        assert wf.compensate("customer cancelled") == ["charge"]
        assert wf.state.status is RunStatus.COMPENSATION_INCOMPLETE
        other = ledger.workflow("wf-clean")
        other.step("charge", charge, {"amount": 7})
        other.compensate("customer cancelled")
        assert other.state.status is RunStatus.COMPENSATED
    assert svc.effects == Counter({"charge": 2, "refund": 2, "email": 1})

    events = events_of(settings, "wf-unwind")
    state = replay("wf-unwind", events)
    assert state.status is RunStatus.COMPENSATION_INCOMPLETE
    assert state.steps["charge"].status is StepStatus.COMPENSATED
    finished = [e.body for e in events if isinstance(e.body, ev.WorkflowFinished)][-1]
    standing = json.loads(finished.left_standing_json or "[]")
    assert [(s["step_id"], s["forward_action"]) for s in standing] == [
        ("email", "send a correction email")
    ]

    db = tmp_path / "sagas.duckdb"
    rebuild(settings, db, force=True)
    con = duckdb.connect(str(db), read_only=True)
    try:
        statuses = dict(con.execute("SELECT workflow_id, status FROM workflows").fetchall())
        open_escalations = con.execute(
            "SELECT escalation_id, kind, workflow_id FROM unresolved_escalations"
        ).fetchall()
        summary = con.execute(
            "SELECT compensated, compensation_incomplete FROM fleet_summary"
        ).fetchall()
    finally:
        con.close()
    assert statuses == {"wf-unwind": "compensation_incomplete", "wf-clean": "compensated"}
    assert open_escalations == [(finished.escalation_id, "left_standing", "wf-unwind")]
    assert summary == [(1, 1)]

    queue = EscalationQueue().extend(events)
    item = queue.get(finished.escalation_id or "")
    assert item.options == (Verdict.COMPENSATED, Verdict.CLEARED)
    with Ledger(settings) as ledger:
        answer(ledger.log, ledger.events, item, Verdict.COMPENSATED, by="ana", note="emailed")
    assert replay("wf-unwind", events_of(settings, "wf-unwind")).status is RunStatus.COMPENSATED


@dataclass(frozen=True)
class Receipt:
    charge_id: str
    amount: Decimal
    at: datetime


def test_a_typed_result_comes_back_from_the_broker_as_it_went_in(settings: Settings) -> None:
    receipt = Receipt("ch_1", Decimal("12.50"), datetime(2026, 1, 1, 12, 0, tzinfo=UTC))

    def charge(args: dict[str, Any], key: str) -> Receipt:
        return receipt

    tool = Tool(name="charge", keyed=True, run=charge)
    with Ledger(settings) as ledger:
        assert (
            ledger.workflow("wf-typed").step("charge", tool, {"day": date(2026, 1, 1)}) is receipt
        )
    with Ledger(settings) as ledger:
        replayed = ledger.workflow("wf-typed").step(
            "charge", tool, {"day": date(2026, 1, 1)}, lambda a, k: "called again!"
        )
    assert replayed == receipt and type(replayed) is Receipt
    assert type(replayed.amount) is Decimal and type(replayed.at) is datetime

"""Pay-then-notify runs; what the saga still refuses at run time, and a failure after the
pivot, go to a person through the log (never a workflow left running with nobody on it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source, Verdict
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import (
    LedgerStateError,
    SagaViolationError,
    StepInDoubtError,
    ToolServiceError,
    WorkflowDeadLetteredError,
    WorkflowTakenOverError,
)
from stepledger.humanqueue.escalations import STEP_VERDICTS, WORKFLOW_VERDICTS, EscalationQueue
from stepledger.producer import escalation
from tests.unit.factories import factory
from tests.unit.resume_fakes import Crash, World

PAY = Tool(name="pay", keyed=True)  # keyed, no refund: the pivot
EMAIL = Tool(name="email")  # no key, no undo: runs at most once
BOOK = Tool(name="book", keyed=True, compensate=lambda a, k, r: {"undone": k})
BOOK_FORWARD = Tool(name="book_forward", keyed=True)
F = factory()


class Mail:
    """An email service that counts what it sent and can refuse an address."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.refuse = False

    def __call__(self, args: dict[str, Any], key: str) -> str:
        if self.refuse:
            raise ToolServiceError("email: HTTP 400: bad address", status=400, tool="email")
        self.sent.append(args["to"])
        return f"sent {len(self.sent)}"


def resume(world: World, workflow_id: str = "order") -> Any:
    """The next run of the workflow, its charge replayed (steps are asked for in order)."""
    wf = world.ledger().workflow(workflow_id)
    wf.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    return wf


def answer(
    world: World, workflow_id: str, escalation_id: str, verdict: Verdict, step: str | None = None
) -> None:
    body = ev.EscalationResolved(escalation_id=escalation_id, verdict=verdict, by="ana")
    world.log.append(F.envelope(workflow_id, step, body))


def test_pay_then_notify_charges_once_and_sends_the_receipt_once() -> None:
    world, mail, charges = World(), Mail(), list[str]()
    wf = world.ledger().workflow("order", plan=[("charge", PAY), ("email", EMAIL)])

    def charge(arguments: dict[str, object], key: str) -> str:
        charges.append(key)
        return "paid"

    wf.step("charge", PAY, {"amount": 5}, charge)
    assert wf.step("email", EMAIL, {"to": "ana"}, mail) == "sent 1"
    wf.finish()
    assert wf.state.steps["email"].after_pivot and len(charges) == 1 and mail.sent == ["ana"]
    replayed = resume(world)
    assert replayed.step("email", EMAIL, {"to": "ana"}, mail) == "sent 1"
    assert mail.sent == ["ana"], "a finished workflow replays the receipt, never sends it again"


def test_a_definite_failure_of_the_email_after_the_charge_goes_to_a_person() -> None:
    world, mail = World(), Mail()
    wf = world.ledger().workflow("order")
    wf.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    mail.refuse = True
    with pytest.raises(ToolServiceError) as raised:
        wf.step("email", EMAIL, {"to": "ana"}, mail)
    step = wf.state.steps["email"]
    assert step.status is StepStatus.FAILED and step.escalation_open
    assert "stepledger escalations resolve" in "".join(raised.value.__notes__)
    abandoned = [e.body for e in world.log.workflow_events("order") if e.type == "step_abandoned"]
    assert len(abandoned) == 1 and isinstance(abandoned[0], ev.StepAbandoned)
    assert abandoned[0].source is Source.AGENT and "failed_after_pivot" in abandoned[0].reason
    [case] = EscalationQueue().extend(world.log.events).open()
    assert case.step_id == "email" and case.options == STEP_VERDICTS
    assert case.escalation_id == step.escalation_id and "failed_after_pivot" in case.reason
    # Asked again, in this run or the next, it runs no second time on its own.
    mail.refuse = False
    with pytest.raises(StepInDoubtError, match="waits for a human") as waiting:
        wf.step("email", EMAIL, {"to": "ana"}, mail)
    assert waiting.value.escalation_id == step.escalation_id
    with pytest.raises(StepInDoubtError, match="cannot complete"):
        wf.finish()
    with pytest.raises(StepInDoubtError):
        resume(world).step("email", EMAIL, {"to": "ana"}, mail)
    assert mail.sent == []
    # The person fixed the address and says it did not happen: it runs once more.
    assert step.escalation_id is not None
    answer(world, "order", step.escalation_id, Verdict.NOT_HAPPENED, "email")
    resumed = resume(world)
    assert resumed.step("email", EMAIL, {"to": "ana"}, mail) == "sent 1"
    resumed.finish()
    assert mail.sent == ["ana"] and resumed.state.status is RunStatus.COMPLETED


def test_a_failure_taken_as_done_by_a_person_replays_without_sending() -> None:
    world, mail = World(), Mail()
    wf = world.ledger().workflow("order")
    wf.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    mail.refuse = True
    with pytest.raises(ToolServiceError):
        wf.step("email", EMAIL, {"to": "ana"}, mail)
    esc = wf.state.steps["email"].escalation_id
    assert esc is not None
    answer(world, "order", esc, Verdict.HAPPENED, "email")  # sent by hand
    mail.refuse = False
    resumed = resume(world)
    assert resumed.step("email", EMAIL, {"to": "ana"}, mail) is None
    resumed.finish()
    assert mail.sent == []


def test_a_failure_before_the_pivot_or_of_a_keyed_step_is_not_escalated() -> None:
    world, mail = World(), Mail()
    wf = world.ledger().workflow("order")
    mail.refuse = True
    with pytest.raises(ToolServiceError):
        wf.step("email", EMAIL, {"to": "ana"}, mail)  # the pivot itself: nothing before it
    assert not wf.state.steps["email"].escalation_open

    def down(args: dict[str, Any], key: str) -> str:
        raise ToolServiceError("pay: HTTP 402", status=402, tool="pay")

    other = world.ledger().workflow("other")
    other.step("first", PAY, {"amount": 1}, lambda a, k: "paid")
    with pytest.raises(ToolServiceError):
        other.step("second", PAY, {"amount": 2}, down)  # keyed: a retry is safe
    assert not other.state.steps["second"].escalation_open
    assert "step_abandoned" not in world.types("order") + world.types("other")


def test_a_crash_between_the_failure_and_its_escalation_escalates_on_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, mail = World(), Mail()
    wf = world.ledger().workflow("order")
    wf.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    mail.refuse = True
    real = escalation.failure_escalation

    def die(*args: Any) -> ev.Event:
        raise Crash

    monkeypatch.setattr(escalation, "failure_escalation", die)
    with pytest.raises(Crash):
        wf.step("email", EMAIL, {"to": "ana"}, mail)
    assert "step_abandoned" not in world.types("order")
    monkeypatch.setattr(escalation, "failure_escalation", real)
    mail.refuse = False
    with pytest.raises(StepInDoubtError, match="waits for a human"):
        resume(world).step("email", EMAIL, {"to": "ana"}, mail)
    assert world.types("order").count("step_abandoned") == 1 and mail.sent == []


def test_an_async_step_escalates_its_failure_after_the_pivot_too() -> None:
    world, mail = World(), Mail()
    wf = world.ledger().workflow("order")

    async def run() -> None:
        await wf.astep("charge", PAY, {"amount": 5}, lambda a, k: "paid")
        mail.refuse = True
        await wf.astep("email", EMAIL, {"to": "ana"}, mail)

    with pytest.raises(ToolServiceError):
        asyncio.run(run())
    assert wf.state.steps["email"].escalation_open


def test_a_step_refused_at_run_time_is_escalated_with_a_one_line_fix() -> None:
    world = World()
    wf = world.ledger().workflow("trip")
    wf.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    with pytest.raises(SagaViolationError) as raised:
        wf.step("book", BOOK, {"hotel": "h"}, lambda a, k: "booked")
    error = raised.value
    message = str(error)
    assert "\n" not in message and message.startswith("step 'book' refused: pivot_passed")
    assert "fix: call it before the pivot, or give it no compensate hook" in message
    assert f"escalation {error.escalation_id}" in message
    assert "stepledger workflows clear trip --by NAME" in message
    assert world.types("trip")[-1] == "workflow_dead_lettered"
    [letter] = world.dead_letters.letters
    assert letter.reason.startswith("saga_violation")
    [case] = EscalationQueue().extend(world.log.events).open()
    assert case.escalation_id == error.escalation_id and case.options == WORKFLOW_VERDICTS
    assert "pivot_passed" in case.reason
    with pytest.raises(LedgerStateError, match="dead_lettered"):
        wf.step("other", PAY, {"amount": 1}, lambda a, k: "paid")
    with pytest.raises(WorkflowDeadLetteredError):
        world.ledger().workflow("trip")
    # Fixed (the booking becomes a forward step) and cleared: the next run goes on.
    assert error.escalation_id is not None
    answer(world, "trip", error.escalation_id, Verdict.CLEARED)
    fixed = resume(world, "trip")
    assert fixed.step("book", BOOK_FORWARD, {"hotel": "h"}, lambda a, k: "booked") == "booked"
    fixed.finish()
    assert fixed.state.status is RunStatus.COMPLETED


def test_a_runner_that_lost_its_claim_records_no_refusal() -> None:
    world = World()
    older = world.ledger().workflow("trip")
    older.step("charge", PAY, {"amount": 5}, lambda a, k: "paid")
    world.ledger().workflow("trip")  # a resume elsewhere claims the next attempt
    with pytest.raises(WorkflowTakenOverError):
        older.step("book", BOOK, {"hotel": "h"}, lambda a, k: "booked")
    assert "workflow_dead_lettered" not in world.types("trip")


def test_the_fold_lets_an_agent_escalate_only_its_own_failure_and_no_retry_runs_past_it() -> None:
    started = F.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)
    intent = F.intent("wf", "email", EMAIL, {}, sequence=1, after_pivot=True)
    failed = F.outcome("wf", "email", attempt=1, status=OutcomeStatus.FAILED, error="400")
    body = ev.StepAbandoned(reason="failed_after_pivot", escalation_id="esc-1", source=Source.AGENT)
    abandoned = F.envelope("wf", "email", body, "esc-1")
    retry = F.intent("wf", "email", EMAIL, {}, sequence=1, attempt=2, after_pivot=True)
    state = replay("wf", [started, intent, failed, abandoned, retry])
    step = state.steps["email"]
    assert step.status is StepStatus.FAILED and step.escalation_open and step.attempt == 1
    assert [a.kind for a in state.anomalies] == ["intent_while_escalated"]
    succeeded = F.outcome("wf", "email", attempt=1, status=OutcomeStatus.SUCCEEDED, result=1)
    done = replay("wf", [started, intent, succeeded, abandoned])
    assert not done.steps["email"].escalation_open
    assert [a.kind for a in done.anomalies] == ["abandon_settled"]

"""Saga ordering: check_plan, the pivot rule on each step, approvals and compensate()."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, OutcomeStatus, Verdict, WorkflowStatus
from stepledger.domain.saga import (
    PlanRules,
    PlanStep,
    ViolationKind,
    check_plan,
    compensation_plan,
    ensure_plan,
    left_standing,
    step_violations,
)
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import (
    ApprovalDeniedError,
    ApprovalPendingError,
    LedgerStateError,
    SagaViolationError,
    StepInDoubtError,
)
from stepledger.history.memory import InMemoryHistory
from stepledger.humanqueue.cases import Answer, escalation_case
from stepledger.producer import approval
from tests.unit.factories import factory
from tests.unit.resume_fakes import Crash, World, crash_after

READ = Tool(name="read", effect="read_only")
PAY = Tool(name="pay", effect="idempotent", keyed=True)
REFUND = lambda a, k, r: {"refunded": k}  # noqa: E731
PAY_R = Tool(name="pay_r", keyed=True, compensate=REFUND)
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: {"undone": k})
CAR = Tool(name="car", effect="compensatable", compensate=lambda a, k, r: {"undone": k})
EMAIL = Tool(name="email", effect="irreversible", correction="send a correction email")
GATED = Tool(name="wire", effect="irreversible", requires_approval=True)
KEYED_FOLLOW_UP = Tool(name="notify", keyed=True)
F = factory()


def test_a_plan_in_saga_order_has_no_violation() -> None:
    plan = [("read", READ), ("pay", PAY_R), ("book", BOOK), ("car", CAR), ("email", EMAIL)]
    assert check_plan(plan) == []
    assert check_plan([("book", BOOK), ("pay", PAY), ("notify", KEYED_FOLLOW_UP)]) == []


def test_a_keyed_charge_with_a_refund_is_both_repeatable_and_undoable() -> None:
    assert PAY_R.repeatable and PAY_R.undoable and not PAY_R.pivot
    assert PAY_R.effect is EffectClass.COMPENSATABLE and PAY_R.resolution.value == "redrive"
    assert PAY.pivot and PAY.repeatable and not PAY.undoable
    assert EMAIL.pivot and not EMAIL.repeatable and EMAIL.resolution.value == "escalate"
    legacy = Tool(name="old", effect="idempotent", keyed=True, compensate=REFUND)
    assert legacy.undoable and legacy.effect is EffectClass.COMPENSATABLE


def test_an_idempotent_charge_without_refund_is_the_pivot() -> None:
    found = check_plan([("pay", PAY), ("book", BOOK), ("email", EMAIL)])
    assert [(v.kind, v.step_id, v.outstanding) for v in found] == [
        (ViolationKind.UNDOABLE_AFTER_PIVOT, "pay", ("book",)),
    ]
    assert [(w.kind, w.outstanding) for w in found.warnings] == [
        (ViolationKind.UNREPEATABLE_AFTER_PIVOT, ("book", "email"))
    ]
    assert check_plan([("pay", PAY_R), ("book", BOOK), ("email", EMAIL)]) == []


def test_the_pivot_first_is_reported_with_every_later_undoable_step() -> None:
    found = check_plan([("email", EMAIL), ("book", BOOK), ("read", READ), ("car", CAR)])
    assert [(v.kind, v.outstanding) for v in found] == [
        (ViolationKind.UNDOABLE_AFTER_PIVOT, ("book", "car")),
    ]
    assert found[0].step_id == "email"


def test_pay_then_notify_is_a_plan_that_runs_with_a_warning_the_author_can_read() -> None:
    # A keyed charge that cannot be undone, then an unkeyed receipt email: the commonest
    # agent shape.  Nothing in it is a violation; the email is named as what a person
    # decides if it fails or its outcome is in doubt.
    found = check_plan([("charge", PAY), ("email", EMAIL)])
    assert found == []
    assert [(w.kind, w.step_id, w.outstanding) for w in found.warnings] == [
        (ViolationKind.UNREPEATABLE_AFTER_PIVOT, "charge", ("email",))
    ]
    assert "runs at most once" in str(found.warnings[0])
    assert "stepledger escalations list" in str(found.warnings[0])
    assert ensure_plan([("charge", PAY), ("email", EMAIL)]) == found.warnings
    plan = [("book", BOOK), ("email", EMAIL), ("notify", KEYED_FOLLOW_UP), ("again", EMAIL)]
    assert check_plan(plan) == [] and check_plan(plan).warnings[0].outstanding == ("again",)
    assert check_plan([("book", BOOK), ("pay", PAY_R)]).warnings == (), "no pivot, no warning"


def test_check_plan_reports_every_violation_at_once() -> None:
    plan = [
        PlanStep("email", EMAIL),
        PlanStep("book", BOOK),
        PlanStep("wire", GATED),
        PlanStep("book", BOOK),
    ]
    found = check_plan(plan, PlanRules(pivot_needs_approval=True))
    kinds = sorted(v.kind.value for v in found)
    assert kinds == ["duplicate_step", "missing_approval", "undoable_after_pivot"]
    assert [w.kind.value for w in found.warnings] == ["unrepeatable_after_pivot"]
    assert all(str(v).startswith(v.kind.value) for v in found)
    gated_first = check_plan(
        [("book", BOOK), ("wire", GATED)], PlanRules(pivot_needs_approval=True)
    )
    assert gated_first == [], "the approval is required at the pivot"


def test_a_read_only_plan_refuses_effectful_tools() -> None:
    found = check_plan([("read", READ), ("pay", PAY)], PlanRules(read_only=True))
    assert [(v.kind, v.step_id) for v in found] == [(ViolationKind.EFFECT_IN_READ_ONLY, "pay")]


def _state(*events: ev.Event) -> Any:
    started = F.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)
    return replay("wf", [started, *events])


def _done(step: str, tool: Tool, seq: int) -> list[ev.Event]:
    intent = F.intent("wf", step, tool, {}, sequence=seq)
    return [intent, F.outcome("wf", step, attempt=1, status=OutcomeStatus.SUCCEEDED, result=1)]


def test_the_pivot_waits_for_undoable_steps_in_doubt() -> None:
    state = _state(*_done("car", CAR, 0), F.intent("wf", "book", BOOK, {}, sequence=1))
    found = step_violations(state, "email", EMAIL)
    assert [(v.kind, v.outstanding) for v in found] == [
        (ViolationKind.UNRESOLVED_BEFORE_PIVOT, ("book",))
    ]
    assert [v.kind for v in step_violations(state, "pay", PAY)] == [
        ViolationKind.UNRESOLVED_BEFORE_PIVOT
    ], "a charge without a refund is a pivot too"
    assert step_violations(state, "pay", PAY_R) == []


def test_after_the_pivot_an_undoable_step_is_refused_and_an_unrepeatable_one_is_not() -> None:
    state = _state(*_done("email", EMAIL, 0))
    found = step_violations(state, "book", BOOK)
    assert [(v.kind, v.outstanding) for v in found] == [(ViolationKind.PIVOT_PASSED, ("email",))]
    assert "fix: call it before the pivot, or give it no compensate hook" in str(found[0])
    assert step_violations(state, "again", EMAIL) == []
    assert step_violations(state, "notify", KEYED_FOLLOW_UP) == []
    failed = _state(
        F.intent("wf", "email", EMAIL, {}, sequence=0),
        F.outcome("wf", "email", attempt=1, status=OutcomeStatus.FAILED, error="smtp down"),
    )
    assert step_violations(failed, "book", BOOK) == [], "a failed pivot did not happen"


def test_compensation_plan_is_newest_first_and_blocked_by_unknown_outcomes() -> None:
    state = _state(*_done("book", BOOK, 0), *_done("pay", PAY_R, 1), *_done("car", CAR, 2))
    undo, blockers = compensation_plan(state)
    assert [s.step_id for s in undo] == ["car", "pay", "book"] and blockers == []
    state.apply(F.intent("wf", "email", EMAIL, {}, sequence=3))
    assert [s.step_id for s in compensation_plan(state)[1]] == ["email"]


def test_what_cannot_be_undone_is_left_standing() -> None:
    state = _state(*_done("book", BOOK, 0), *_done("pay", PAY, 1))
    assert [s.step_id for s in compensation_plan(state)[0]] == ["book"]
    assert [s.step_id for s in left_standing(state)] == ["book", "pay"]


# -- the SDK enforcing them ---------------------------------------------------------------


def test_the_sdk_refuses_a_plan_with_the_pivot_first_before_recording_anything() -> None:
    world = World()
    with pytest.raises(SagaViolationError) as raised:
        world.ledger().workflow("wf", plan=[("email", EMAIL), ("book", BOOK)])
    assert raised.value.outstanding == ("book",)
    assert world.log.events == []


def test_the_sdk_refuses_a_compensatable_step_once_the_pivot_ran() -> None:
    world = World()
    wf = world.ledger().workflow("wf")
    wf.step("email", EMAIL, {}, lambda a, k: "sent")
    with pytest.raises(SagaViolationError, match="pivot_passed") as raised:
        wf.step("book", BOOK, {}, lambda a, k: "booked")
    assert raised.value.outstanding == ("email",)
    assert world.types("wf") == [
        "workflow_started",
        "step_intended",
        "step_outcome",
        "workflow_dead_lettered",
    ], "refused before the booking's intent, and the refusal is in the log for a person"


def test_the_sdk_refuses_the_pivot_while_a_booking_is_in_doubt() -> None:
    world = World(resolve_timeout_s=0.01)
    svc = world.services
    wf = world.ledger().workflow("wf")
    with pytest.raises(Crash):
        # Died before the service booked: a query finding the booking would settle it at once.
        wf.step("book", svc.book, {"hotel": "h"}, crash_after(svc.book, effect=False))
    ledger = world.ledger(tools=False)
    world.clock.advance(-60)  # the deadline of the booking is still ahead
    wf = ledger.workflow("wf")
    with pytest.raises(StepInDoubtError):
        wf.step("book", svc.book, {"hotel": "h"})
    with pytest.raises(SagaViolationError, match="unresolved") as raised:
        wf.step("email", svc.email, {"to": "x"})
    assert raised.value.outstanding == ("book",) and svc.calls["email"] == 0
    # It waits for the booking to be decided (recovery's or a person's): nothing to escalate.
    assert raised.value.escalation_id is None
    assert "workflow_dead_lettered" not in world.types("wf")


def test_an_approval_gate_requests_and_refuses_until_granted() -> None:
    world = World()
    calls: list[str] = []
    wf = world.ledger().workflow("wf")
    with pytest.raises(ApprovalPendingError, match="stepledger approve wf wire"):
        wf.step("wire", GATED, {"amount": 1}, lambda a, k: calls.append(k))
    assert world.types("wf")[-1] == "approval_requested" and calls == []
    with pytest.raises(ApprovalPendingError):
        world.ledger().workflow("wf").step("wire", GATED, {"amount": 1}, lambda a, k: 0)
    assert world.types("wf").count("approval_requested") == 1
    decide(world, granted=True)
    wf = world.ledger().workflow("wf")
    wf.step("wire", GATED, {"amount": 1}, lambda a, k: calls.append(k))
    assert len(calls) == 1 and wf.state.steps["wire"].status is StepStatus.SUCCEEDED


def test_a_denied_step_never_runs() -> None:
    world = World()
    with pytest.raises(ApprovalPendingError):
        world.ledger().workflow("wf").step("wire", GATED, {}, lambda a, k: 1)
    decide(world, granted=False)
    with pytest.raises(ApprovalDeniedError):
        world.ledger().workflow("wf").step("wire", GATED, {}, lambda a, k: 1)


def test_an_agent_can_wait_for_the_approval() -> None:
    world = World(approval_wait_s=10.0)
    wf = world.ledger().workflow("wf")
    requested = threading.Event()
    original = wf.record

    def record(event: ev.Event) -> Any:
        position = original(event)
        if event.type == "approval_requested":
            requested.set()
        return position

    wf.record = record  # type: ignore[method-assign]

    def approve() -> None:
        if requested.wait(10):
            decide(world, granted=True)

    approver = threading.Thread(target=approve)
    approver.start()
    assert wf.step("wire", GATED, {}, lambda a, k: "wired") == "wired"
    approver.join(10)


def test_deciding_a_step_that_awaits_nothing_is_refused() -> None:
    world = World()
    world.ledger().workflow("wf")
    with pytest.raises(LedgerStateError, match="awaits no approval"):
        decide(world, granted=True)


def decide(world: World, *, granted: bool) -> None:
    ledger = world.ledger()
    reader = InMemoryHistory(world.log)
    approval.decide(ledger.log, ledger.events, reader, "wf", "wire", granted=granted, by="ops")


def test_compensate_undoes_completed_steps_newest_first() -> None:
    world = World()
    undone: list[str] = []
    book = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: undone.append(r))
    wf = world.ledger().workflow("wf")
    wf.step("pay", PAY_R, {}, lambda a, k: "paid")
    wf.step("hotel", book, {"h": 1}, lambda a, k: "hotel-1")
    wf.step("flight", book, {"f": 2}, lambda a, k: "flight-2")
    assert wf.compensate("customer cancelled") == ["flight", "hotel", "pay"]
    assert undone == ["flight-2", "hotel-1"]
    steps = wf.state.steps
    assert steps["flight"].status is StepStatus.COMPENSATED
    assert steps["pay"].status is StepStatus.COMPENSATED, "the keyed charge is refunded too"
    pairs = [e.type for e in world.log.workflow_events("wf") if e.type.startswith("compensation")]
    assert pairs == ["compensation_intended", "compensation_outcome"] * 3
    assert wf.state.status is RunStatus.COMPENSATED


def test_compensate_refuses_around_a_step_whose_outcome_is_unknown() -> None:
    world = World()
    svc = world.services
    wf = world.ledger().workflow("wf")
    wf.step("book", svc.book, {"hotel": "h"})
    with pytest.raises(Crash):
        wf.step("email", svc.email, {"to": "x"}, crash_after(svc.email, effect=False))
    with pytest.raises(StepInDoubtError, match="email"):
        wf.compensate()
    assert svc.effects.get("cancel", 0) == 0 and wf.state.status is RunStatus.RUNNING


def test_finish_refuses_to_complete_with_effects_in_doubt_and_is_idempotent() -> None:
    world = World()
    wf = world.ledger().workflow("wf")
    with pytest.raises(Crash):
        wf.step("pay", PAY, {}, crash_after(PAY, effect=False))
    with pytest.raises(StepInDoubtError):
        wf.finish()
    wf.finish(WorkflowStatus.FAILED, "gave up")
    wf.finish(WorkflowStatus.FAILED, "gave up")
    assert world.types("wf").count("workflow_finished") == 1
    assert wf.state.steps["pay"].effect is EffectClass.IDEMPOTENT


def test_an_effect_that_cannot_be_undone_ends_the_workflow_compensation_incomplete() -> None:
    world = World()
    svc = world.services
    wf = world.ledger().workflow("wf")
    wf.step("charge", svc.charge, {"amount": 5})
    wf.step("book", svc.book, {"hotel": "h"})
    wf.step("email", EMAIL, {"to": "x"}, lambda a, k: "sent")
    assert wf.compensate("customer cancelled") == ["book", "charge"]
    assert svc.effects["refund"] == 1 and svc.effects["cancel"] == 1
    assert wf.state.status is RunStatus.COMPENSATION_INCOMPLETE and wf.finished
    finished = [e for e in world.log.workflow_events("wf") if e.type == "workflow_finished"]
    body = finished[-1].body
    assert isinstance(body, ev.WorkflowFinished)
    assert body.escalation_id is not None and wf.state.escalation_id == body.escalation_id
    standing = json.loads(body.left_standing_json or "[]")
    assert [(s["step_id"], s["forward_action"]) for s in standing] == [
        ("email", "send a correction email")
    ]
    assert [s.step_id for s in wf.left_standing] == ["email"]


def test_a_failed_undo_is_left_standing_and_the_others_still_run() -> None:
    world = World()

    def broken(a: Any, k: str, r: Any) -> Any:
        raise RuntimeError("refunds are down")

    pay = Tool(name="pay_broken", keyed=True, compensate=broken)
    wf = world.ledger().workflow("wf")
    wf.step("pay", pay, {}, lambda a, k: "paid")
    wf.step("car", CAR, {}, lambda a, k: "car-1")
    assert wf.compensate("cancelled") == ["car"]
    assert wf.state.steps["pay"].status is StepStatus.COMPENSATION_FAILED
    assert wf.state.status is RunStatus.COMPENSATION_INCOMPLETE


def test_a_human_who_took_the_forward_action_makes_the_workflow_compensated() -> None:
    world = World()
    wf = world.ledger().workflow("wf")
    wf.step("email", EMAIL, {"to": "x"}, lambda a, k: "sent")
    wf.compensate("cancelled")
    escalation = wf.state.escalation_id
    assert escalation is not None
    answer = ev.EscalationResolved(escalation_id=escalation, verdict=Verdict.COMPENSATED, by="ana")
    wf.record(F.envelope("wf", None, answer))
    assert wf.state.status is RunStatus.COMPENSATED and wf.state.escalation_id is None


def test_intents_after_a_pivot_say_so() -> None:
    world = World()
    svc = world.services
    wf = world.ledger().workflow("wf")
    wf.step("book", svc.book, {"hotel": "h"})
    wf.step("email", EMAIL, {"to": "x"}, lambda a, k: "sent")
    wf.step("notify", KEYED_FOLLOW_UP, {}, lambda a, k: "ok")
    steps = wf.state.steps
    assert not steps["book"].after_pivot and not steps["email"].after_pivot
    assert steps["notify"].after_pivot


def test_recovery_never_compensates_a_step_after_a_pivot_that_happened() -> None:
    from datetime import timedelta

    from stepledger.domain import resolution as rs

    booked = Tool(
        name="book2", keyed=True, compensate=REFUND, policy="compensate", run=lambda a, k: 1
    )
    unkeyed = Tool(name="book3", compensate=REFUND)
    for tool, expected in ((booked, rs.ActionKind.REDRIVE), (unkeyed, rs.ActionKind.ESCALATE)):
        assert tool.resolution.value == "compensate"
        intent = F.intent("wf", "late", tool, {}, sequence=1, after_pivot=True)
        step = _state(*_done("email", EMAIL, 0), intent).steps["late"]
        assert step.after_pivot
        later = (step.deadline or F.clock()) + timedelta(hours=1)
        assert rs.decide(step, tool, now=later).kind is expected
        before = _state(F.intent("wf", "late", tool, {}, sequence=0)).steps["late"]
        assert rs.decide(before, tool, now=later).kind is rs.ActionKind.COMPENSATE


def test_the_inbox_shows_effects_left_standing_as_an_open_case_with_their_answers() -> None:
    world = World()
    wf = world.ledger().workflow("wf")
    wf.step("email", EMAIL, {"to": "x"}, lambda a, k: "sent")
    wf.compensate("cancelled")
    escalation = wf.state.escalation_id
    assert escalation is not None
    case = escalation_case("wf", escalation, world.log.workflow_events("wf"))
    assert case is not None and case.is_open and case.step_id is None
    assert set(case.options) == {Answer.COMPENSATED, Answer.CLEARED}
    assert case.evidence["left_standing"][0]["step_id"] == "email"
    answer = ev.EscalationResolved(escalation_id=escalation, verdict=Verdict.COMPENSATED, by="ana")
    wf.record(F.envelope("wf", None, answer))
    closed = escalation_case("wf", escalation, world.log.workflow_events("wf"))
    assert closed is not None and not closed.is_open


def test_pivot_happened_agrees_with_pivot_passed_and_a_long_saga_stays_cheap() -> None:
    from stepledger.domain.saga import pivot_may_have_passed, pivot_passed

    world = World()
    wf = world.ledger().workflow("wf")
    assert not pivot_may_have_passed(wf.state) and pivot_passed(wf.state) == []
    wf.step("book", BOOK, {}, lambda a, k: "booked")  # undoable: not a pivot
    assert not pivot_may_have_passed(wf.state)
    wf.step("email", EMAIL, {}, lambda a, k: "sent")
    assert pivot_may_have_passed(wf.state) and [s.step_id for s in pivot_passed(wf.state)] == [
        "email"
    ]
    assert not pivot_may_have_passed(wf.state, "email")  # the step itself does not count
    # Every later keyed step comes after the pivot; checking it does not list the pivots.
    for n in range(300):
        wf.step(f"pay-{n}", PAY, {"n": n}, lambda a, k: 1)
    assert all(s.after_pivot for s in wf.state.steps.values() if s.step_id.startswith("pay-"))

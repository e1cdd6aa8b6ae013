"""Saga ordering: check_plan, the pivot rule on each step, approvals and compensate()."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, OutcomeStatus, WorkflowStatus
from stepledger.domain.saga import (
    PlanRules,
    PlanStep,
    ViolationKind,
    check_plan,
    compensation_plan,
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
from stepledger.producer import approval
from stepledger.producer.reader import InMemoryWorkflowReader
from tests.unit.factories import factory
from tests.unit.resume_fakes import Crash, World, crash_after

READ = Tool(name="read", effect="read_only")
PAY = Tool(name="pay", effect="idempotent", keyed=True)
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: {"undone": k})
CAR = Tool(name="car", effect="compensatable", compensate=lambda a, k, r: {"undone": k})
EMAIL = Tool(name="email", effect="irreversible")
GATED = Tool(name="wire", effect="irreversible", requires_approval=True)
F = factory()


def test_a_plan_in_saga_order_has_no_violation() -> None:
    plan = [("read", READ), ("pay", PAY), ("book", BOOK), ("car", CAR), ("email", EMAIL)]
    assert check_plan(plan) == []


def test_an_irreversible_step_first_is_reported_with_every_later_compensatable_step() -> None:
    found = check_plan([("email", EMAIL), ("book", BOOK), ("read", READ), ("car", CAR)])
    assert [v.kind for v in found] == [ViolationKind.IRREVERSIBLE_BEFORE_COMPENSATABLE]
    assert found[0].step_id == "email" and found[0].outstanding == ("book", "car")


def test_check_plan_reports_every_violation_at_once() -> None:
    plan = [
        PlanStep("email", EMAIL),
        PlanStep("book", BOOK),
        PlanStep("wire", GATED),
        PlanStep("book", BOOK),
    ]
    found = check_plan(plan, PlanRules(irreversible_needs_approval=True))
    kinds = sorted(v.kind.value for v in found)
    assert kinds == [
        "duplicate_step",
        "irreversible_before_compensatable",
        "irreversible_before_compensatable",
        "missing_approval",
    ]
    assert all(str(v).startswith(v.kind.value) for v in found)


def test_a_read_only_plan_refuses_effectful_tools() -> None:
    found = check_plan([("read", READ), ("pay", PAY)], PlanRules(read_only=True))
    assert [(v.kind, v.step_id) for v in found] == [(ViolationKind.EFFECT_IN_READ_ONLY, "pay")]


def _state(*events: ev.Event) -> Any:
    started = F.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)
    return replay("wf", [started, *events])


def _done(step: str, tool: Tool, seq: int) -> list[ev.Event]:
    intent = F.intent("wf", step, tool, {}, sequence=seq)
    return [intent, F.outcome("wf", step, attempt=1, status=OutcomeStatus.SUCCEEDED, result=1)]


def test_the_pivot_waits_for_compensatable_steps_in_doubt() -> None:
    state = _state(*_done("car", CAR, 0), F.intent("wf", "book", BOOK, {}, sequence=1))
    found = step_violations(state, "email", EMAIL)
    assert [(v.kind, v.outstanding) for v in found] == [
        (ViolationKind.UNRESOLVED_BEFORE_PIVOT, ("book",))
    ]
    assert step_violations(state, "pay", PAY) == []


def test_a_compensatable_step_after_the_pivot_is_refused() -> None:
    state = _state(*_done("email", EMAIL, 0))
    found = step_violations(state, "book", BOOK)
    assert [(v.kind, v.outstanding) for v in found] == [(ViolationKind.PIVOT_PASSED, ("email",))]
    failed = _state(
        F.intent("wf", "email", EMAIL, {}, sequence=0),
        F.outcome("wf", "email", attempt=1, status=OutcomeStatus.FAILED, error="smtp down"),
    )
    assert step_violations(failed, "book", BOOK) == [], "a failed pivot did not happen"


def test_compensation_plan_is_newest_first_and_blocked_by_unknown_outcomes() -> None:
    state = _state(*_done("book", BOOK, 0), *_done("pay", PAY, 1), *_done("car", CAR, 2))
    undo, blockers = compensation_plan(state)
    assert [s.step_id for s in undo] == ["car", "book"] and blockers == []
    state.apply(F.intent("wf", "email", EMAIL, {}, sequence=3))
    assert [s.step_id for s in compensation_plan(state)[1]] == ["email"]


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
    assert world.types("wf") == ["workflow_started", "step_intended", "step_outcome"]


def test_the_sdk_refuses_the_pivot_while_a_booking_is_in_doubt() -> None:
    world = World(resolve_timeout_s=0.01)
    svc = world.services
    wf = world.ledger().workflow("wf")
    with pytest.raises(Crash):
        wf.step("book", svc.book, {"hotel": "h"}, crash_after(svc.book, effect=True))
    ledger = world.ledger(tools=False)
    world.clock.advance(-60)  # the deadline of the booking is still ahead
    wf = ledger.workflow("wf")
    with pytest.raises(StepInDoubtError):
        wf.step("book", svc.book, {"hotel": "h"})
    with pytest.raises(SagaViolationError, match="unresolved") as raised:
        wf.step("email", svc.email, {"to": "x"})
    assert raised.value.outstanding == ("book",) and svc.calls["email"] == 0


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
    approver = threading.Thread(target=lambda: requested.wait(10) and decide(world, granted=True))
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
    reader = InMemoryWorkflowReader(world.log)
    approval.decide(ledger.log, ledger.events, reader, "wf", "wire", granted=granted, by="ops")


def test_compensate_undoes_completed_steps_newest_first() -> None:
    world = World()
    undone: list[str] = []
    book = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: undone.append(r))
    wf = world.ledger().workflow("wf")
    wf.step("pay", PAY, {}, lambda a, k: "paid")
    wf.step("hotel", book, {"h": 1}, lambda a, k: "hotel-1")
    wf.step("flight", book, {"f": 2}, lambda a, k: "flight-2")
    assert wf.compensate("customer cancelled") == ["flight", "hotel"]
    assert undone == ["flight-2", "hotel-1"]
    steps = wf.state.steps
    assert (
        steps["flight"].status is StepStatus.COMPENSATED
        and steps["pay"].status.value == "succeeded"
    )
    pairs = [e.type for e in world.log.workflow_events("wf") if e.type.startswith("compensation")]
    assert pairs == ["compensation_intended", "compensation_outcome"] * 2
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

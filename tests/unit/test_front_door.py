"""One front door: ``import stepledger as sl`` is enough to write and test an agent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import pytest

import stepledger as sl
from stepledger.testing import Crash, InMemoryEventLog, ManualClock, ledger_over

PINNED = [
    "ApprovalDeniedError",
    "ApprovalMismatchError",
    "ApprovalPendingError",
    "BrokerError",
    "DurabilityError",
    "EffectClass",
    "Found",
    "HistoryExpiredError",
    "Ledger",
    "LedgerStateError",
    "NotFound",
    "PlanMismatchError",
    "PlanRules",
    "PlanStep",
    "ResolutionPolicy",
    "ResultTypeError",
    "ResumeOptions",
    "SagaViolationError",
    "Settings",
    "SnapshotTailReader",
    "StepCompensatedError",
    "StepInDoubtError",
    "StepLedgerError",
    "StepSummary",
    "Tool",
    "ToolCallError",
    "ToolDefinitionError",
    "ToolRegistry",
    "ToolServiceError",
    "Violation",
    "Workflow",
    "WorkflowCancelledError",
    "WorkflowDeadLetteredError",
    "WorkflowPausedError",
    "WorkflowStatus",
    "WorkflowTakenOverError",
    "check_plan",
    "keep_last",
    "load_settings",
    "render",
    "tool",
]


def test_the_public_api_is_pinned_sorted_and_importable() -> None:
    assert sl.__all__ == PINNED == sorted(PINNED)
    for name in PINNED:
        assert getattr(sl, name) is not None


def test_every_exception_the_docs_tell_users_to_catch_is_at_the_front_door() -> None:
    for name in (
        "StepCompensatedError",
        "StepInDoubtError",
        "ApprovalPendingError",
        "ApprovalDeniedError",
        "WorkflowDeadLetteredError",
        "PlanMismatchError",
        "SagaViolationError",
        "DurabilityError",
        "ToolCallError",
        "ResultTypeError",
    ):
        assert issubclass(getattr(sl, name), sl.StepLedgerError)


@dataclass(frozen=True)
class Receipt:
    charge_id: str
    amount: int
    day: date


CHARGES: dict[str, Receipt] = {}
REFUNDS: list[str] = []


def refund(args: dict[str, Any], idempotency_key: str, result: Any) -> Any:
    if idempotency_key not in CHARGES:
        return sl.NotFound("nothing to undo")
    REFUNDS.append(idempotency_key)
    return {"refunded": idempotency_key}


@sl.tool(keyed=True, compensate=refund)
def charge(amount: int, day: date, *, idempotency_key: str) -> Receipt:
    receipt = CHARGES.setdefault(idempotency_key, Receipt(f"ch-{len(CHARGES)}", amount, day))
    assert isinstance(day, date), "arguments arrive in the declared types"
    return receipt


def test_a_decorated_function_is_a_keyed_undoable_tool_with_typed_results() -> None:
    assert isinstance(charge, sl.Tool) and charge.name == "charge"
    assert charge.repeatable and charge.undoable and not charge.pivot
    log = InMemoryEventLog()
    wf = ledger_over(log).workflow("order-1")
    first = wf.step("charge", charge, amount=1250, day=date(2026, 1, 1))
    replayed = (
        ledger_over(log)
        .workflow("order-1")
        .step("charge", charge, amount=1250, day=date(2026, 1, 1))
    )
    assert replayed == first and type(replayed) is Receipt
    assert charge(5, date(2026, 1, 2), idempotency_key="direct").amount == 5


def test_a_redrive_from_the_log_gets_the_declared_argument_types() -> None:
    assert charge.run is not None
    receipt = charge.run({"amount": 7, "day": "2026-03-04"}, "redriven")
    assert receipt.day == date(2026, 3, 4)


def test_a_keyed_function_must_take_the_key() -> None:
    def unkeyed(amount: int) -> int:
        return amount

    with pytest.raises(sl.ToolDefinitionError, match="idempotency_key"):
        sl.tool(unkeyed, keyed=True)
    assert sl.tool(unkeyed).pivot, "no key, no undo: a pivot"


def test_the_testing_module_resumes_a_crashed_agent_without_a_broker() -> None:
    log, clock = InMemoryEventLog(), ManualClock()
    calls: list[str] = []

    @sl.tool(keyed=True)
    def book(hotel: str, *, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise Crash  # the process dies inside the call: no outcome recorded
        return f"booked {hotel}"

    with pytest.raises(Crash):
        ledger_over(log, tools=[book], clock=clock).workflow("trip").step("b", book, hotel="h")
    clock.advance(60)  # past the intent's deadline
    wf = ledger_over(log, tools=[book], clock=clock).workflow("trip")
    assert wf.step("b", book, hotel="h") == "booked h"
    assert calls[0] == calls[1], "the re-drive reused the key"


def test_the_sdk_imports_neither_the_daemons_package_nor_the_projectors() -> None:
    import subprocess
    import sys

    code = (
        "import sys, stepledger, stepledger.producer, stepledger.testing\n"
        "from stepledger.history import legacy\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('stepledger.recovery', "
        "'stepledger.projector')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""

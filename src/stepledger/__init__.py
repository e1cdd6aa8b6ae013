"""stepledger: a durable step log that lets fleets of AI agents survive crashes.

``import stepledger as sl`` is the front door::

    @sl.tool(keyed=True, compensate=refund)       # a repeat is safe; a refund undoes it
    def charge(amount: int, currency: str, *, idempotency_key: str) -> Receipt: ...

    with sl.Ledger(sl.load_settings()) as ledger:
        wf = ledger.workflow("order-42")           # starts it, or resumes it after a crash
        receipt = wf.step("charge", charge, amount=1250, currency="EUR")
        wf.finish()

Every effectful call is bracketed by a durable intent and outcome on Kafka.
``stepledger.testing`` has the in-memory log and clock for unit tests.  The subpackages
(``projector``, ``recovery``, ``resolution``, ``domain``) are for operators and
contributors; an agent needs nothing from them.
"""

from stepledger.config import Settings, load_settings
from stepledger.domain.context import StepSummary, keep_last, render
from stepledger.domain.decorator import tool
from stepledger.domain.enums import EffectClass, ResolutionPolicy, WorkflowStatus
from stepledger.domain.saga import PlanRules, PlanStep, Violation, check_plan
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import (
    ApprovalDeniedError,
    ApprovalMismatchError,
    ApprovalPendingError,
    BrokerError,
    DurabilityError,
    HistoryExpiredError,
    LedgerStateError,
    PlanMismatchError,
    ResultTypeError,
    SagaViolationError,
    StepCompensatedError,
    StepInDoubtError,
    StepLedgerError,
    ToolCallError,
    ToolDefinitionError,
    ToolServiceError,
    WorkflowCancelledError,
    WorkflowDeadLetteredError,
    WorkflowPausedError,
    WorkflowTakenOverError,
)
from stepledger.producer import Ledger, ResumeOptions, SnapshotTailReader, Workflow
from stepledger.resolution import ToolRegistry

__all__ = [
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

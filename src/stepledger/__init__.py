"""stepledger: a durable step log that lets fleets of AI agents survive crashes.

The public API: define tools (:class:`Tool`), open workflows through a :class:`Ledger`
(start or resume), and run steps with :meth:`Workflow.step`; every effectful call is
bracketed by a durable intent and outcome on Kafka.  Subpackages hold the rest:
``stepledger.projector`` (DuckDB views), ``stepledger.recovery`` (in-doubt resolution),
``stepledger.domain`` (the pure core).
"""

from stepledger.config import Settings, load_settings
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.events import Event
from stepledger.domain.saga import PlanStep, check_plan
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import (
    ApprovalPendingError,
    DurabilityError,
    PlanMismatchError,
    SagaViolationError,
    StepCompensatedError,
    StepInDoubtError,
    StepLedgerError,
    ToolDefinitionError,
    WorkflowDeadLetteredError,
)
from stepledger.log import EventLog, InMemoryEventLog, KafkaEventLog
from stepledger.producer import Ledger, ResumeOptions, Workflow
from stepledger.recovery import Resolver, ToolRegistry

__all__ = [
    "ApprovalPendingError",
    "DurabilityError",
    "EffectClass",
    "Event",
    "EventLog",
    "Found",
    "InMemoryEventLog",
    "KafkaEventLog",
    "Ledger",
    "NotFound",
    "PlanMismatchError",
    "PlanStep",
    "ResolutionPolicy",
    "Resolver",
    "ResumeOptions",
    "SagaViolationError",
    "Settings",
    "StepCompensatedError",
    "StepInDoubtError",
    "StepLedgerError",
    "Tool",
    "ToolDefinitionError",
    "ToolRegistry",
    "Workflow",
    "WorkflowDeadLetteredError",
    "check_plan",
    "load_settings",
]

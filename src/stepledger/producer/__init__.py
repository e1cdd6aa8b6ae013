"""The producer SDK agents call: workflows, durable intent/outcome brackets, resume and sagas."""

from stepledger.domain.context import StepSummary, keep_last, render
from stepledger.domain.saga import PlanRules, PlanStep, Violation, check_plan
from stepledger.history.legacy import (
    InMemoryWorkflowReader,
    KafkaPartitionReader,
    KafkaScanReader,
    SnapshotTailReader,
    WorkflowReader,
)
from stepledger.producer.ledger import Ledger, Workflow
from stepledger.producer.session import ResumeOptions

__all__ = [
    "InMemoryWorkflowReader",
    "KafkaPartitionReader",
    "KafkaScanReader",
    "Ledger",
    "PlanRules",
    "PlanStep",
    "ResumeOptions",
    "SnapshotTailReader",
    "StepSummary",
    "Violation",
    "Workflow",
    "WorkflowReader",
    "check_plan",
    "keep_last",
    "render",
]

"""Closed sets shared by events, tool specs and state (mirrors the Avro enums in schemas/)."""

from __future__ import annotations

from enum import StrEnum


class EffectClass(StrEnum):
    """What a tool's effect is."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    COMPENSATABLE = "compensatable"
    IRREVERSIBLE = "irreversible"


class ResolutionPolicy(StrEnum):
    """How an intent with no outcome is resolved."""

    QUERY = "query"
    REDRIVE = "redrive"
    COMPENSATE = "compensate"
    ESCALATE = "escalate"


class OutcomeStatus(StrEnum):
    """What became of a step's effect."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NOT_HAPPENED = "not_happened"


class Source(StrEnum):
    """Who produced an event's decision."""

    AGENT = "agent"
    RECOVERY_QUERY = "recovery_query"
    RECOVERY_REDRIVE = "recovery_redrive"
    RECOVERY_COMPENSATE = "recovery_compensate"
    RECOVERY = "recovery"
    HUMAN = "human"
    RECONCILE = "reconcile"


class CompensationStatus(StrEnum):
    """What became of a compensation."""

    SUCCEEDED = "succeeded"
    NOTHING_TO_UNDO = "nothing_to_undo"
    FAILED = "failed"


class Verdict(StrEnum):
    """A human's answer to an escalation."""

    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    COMPENSATED = "compensated"
    CLEARED = "cleared"


class WorkflowStatus(StrEnum):
    """How a workflow ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    COMPENSATION_INCOMPLETE = "compensation_incomplete"
    """It unwound what could be undone; effects that happened are left standing."""
    CANCELLED = "cancelled"
    """An operator cancelled it: undoable effects were undone and nothing is left standing."""
    RESTARTED = "restarted"
    """An operator restarted it from a step as another workflow (``restarted_as``)."""

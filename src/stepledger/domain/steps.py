"""A step as the log tells it: where it stands, and the statuses the fold sorts it into.

The values of the one fold (:mod:`stepledger.domain.state`); the transitions that move a
step from one status to the next are in :mod:`stepledger.domain.transitions`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum

from stepledger.domain import approvals
from stepledger.domain.enums import EffectClass, ResolutionPolicy, Source


class StepStatus(StrEnum):
    """Where a step stands."""

    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    DENIED = "denied"
    INTENDED = "intended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NOT_HAPPENED = "not_happened"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    ABANDONED = "abandoned"


class RunStatus(StrEnum):
    """Where a workflow stands."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    COMPENSATION_INCOMPLETE = "compensation_incomplete"
    """Unwound as far as it could be: effects that happened are left standing (escalated)."""
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    """An operator cancelled it and nothing that happened is left standing."""
    RESTARTED = "restarted"
    """An operator restarted it from a step as another workflow, which runs on in its place."""
    PAUSED = "paused"
    """Shown, never folded: a running workflow an operator paused (``WorkflowState.paused``)."""
    CANCELLING = "cancelling"
    """Shown, never folded: a running workflow an operator asked to cancel."""


#: How a workflow may end (it runs nothing new afterwards).
ENDED = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.COMPENSATED,
        RunStatus.COMPENSATION_INCOMPLETE,
        RunStatus.CANCELLED,
        RunStatus.RESTARTED,
    }
)


#: Statuses from which a new intent for the same step is legitimate (a retry).
RETRYABLE = frozenset(
    {StepStatus.FAILED, StepStatus.NOT_HAPPENED, StepStatus.APPROVED, StepStatus.AWAITING_APPROVAL}
)
#: Undoable steps in these states block a pivot: their effect is unknown or being undone.
UNRESOLVED = frozenset(
    {
        StepStatus.INTENDED,
        StepStatus.COMPENSATING,
        StepStatus.ABANDONED,
        StepStatus.COMPENSATION_FAILED,
    }
)
#: A pivot step in these states may have happened: the saga can only go forward.
MAY_HAVE_HAPPENED = frozenset({StepStatus.INTENDED, StepStatus.SUCCEEDED, StepStatus.ABANDONED})
#: Statuses in which the step's effect is settled and nothing runs.
SETTLED = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.COMPENSATED, StepStatus.FAILED, StepStatus.NOT_HAPPENED}
)


@dataclass(frozen=True)
class Anomaly:
    """An event that contradicts the state it arrived in, recorded instead of applied."""

    event_id: str
    workflow_id: str
    step_id: str | None
    kind: str
    detail: str


@dataclass(frozen=True)
class StepState:
    """One step as the log tells it."""

    step_id: str
    status: StepStatus
    sequence: int = -1
    tool: str = ""
    effect: EffectClass | None = None
    policy: ResolutionPolicy | None = None
    repeatable: bool = False
    """A repeat of the call is safe (keyed, idempotent or read-only)."""
    undoable: bool = False
    """The effect can be undone (the tool has a compensate hook)."""
    after_pivot: bool = False
    """A pivot of the workflow may have happened before this step's intent."""
    idempotency_key: str = ""
    runner: str | None = None
    """The runner whose intent the step's current attempt is (None before 0.3.0)."""
    epoch: int = 0
    """The workflow attempt (claim) under which that intent was written (0 before 0.3.0)."""
    arguments_json: str = "{}"
    arguments_digest: str = ""
    deadline: datetime | None = None
    attempt: int = 0
    recovery_attempts: int = 0
    result_json: str | None = None
    result_type: str | None = None
    """Which codec wrote ``result_json`` (see :mod:`stepledger.domain.results`)."""
    error: str | None = None
    resolved_by: Source | None = None
    escalation_id: str | None = None
    escalation_open: bool = False
    compensation_key: str | None = None
    first_at: datetime | None = None
    last_at: datetime | None = None
    intended_at: datetime | None = None
    resolved_at: datetime | None = None
    approval: approvals.ApprovalGate | None = None
    """The step's newest approval request and its decision (:mod:`~stepledger.domain.approvals`)."""

    @property
    def in_doubt(self) -> bool:
        """True when an intent has no outcome: the effect may or may not have happened."""
        return self.status is StepStatus.INTENDED

    @property
    def effectful(self) -> bool:
        """True when the step's tool changes something (not read-only)."""
        return self.effect is not EffectClass.READ_ONLY

    @property
    def pivot(self) -> bool:
        """True when the step's effect cannot be undone."""
        return self.effect is not None and self.effectful and not self.undoable

    @property
    def pivot_happened(self) -> bool:
        """True when the step is a pivot that may have happened: the saga goes forward."""
        # ``pivot`` spelt out: the fold asks this twice per event.
        effect = self.effect
        return (
            self.status in MAY_HAVE_HAPPENED
            and effect is not None
            and effect is not EffectClass.READ_ONLY
            and not self.undoable
        )

    @property
    def unresolved_undoable(self) -> bool:
        """True when the step can be undone but its effect is unknown or being undone."""
        return self.undoable and (self.status in UNRESOLVED or self.escalation_open)


_STEP_FIELDS = frozenset(f.name for f in fields(StepState))


def replace(step: StepState, **changes: object) -> StepState:
    """A copy of the step with some fields changed (``dataclasses.replace``, minus its cost).

    ``dataclasses.replace`` re-runs the frozen ``__init__`` field by field, which made it
    most of the projector's fold time.
    """
    return with_changes(step, changes)


def with_changes(step: StepState, changes: dict[str, object]) -> StepState:
    """:func:`replace` with the changes in a dict (the fold's transitions return one)."""
    new = object.__new__(StepState)
    values = new.__dict__
    values.update(step.__dict__)
    values.update(changes)
    # A step's __dict__ holds exactly its fields, so an unknown name makes it longer.
    if len(values) != len(_STEP_FIELDS):
        raise TypeError(f"StepState has no fields {sorted(changes.keys() - _STEP_FIELDS)}")
    return new

"""Frozen pydantic models of every event; they mirror schemas/ field for field.

Each body model has a ``type`` tag: it is not an Avro field but the name of the
envelope's union branch, which is how JSON (``tail``/``append``) tells bodies apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
    WorkflowStatus,
)
from stepledger.errors import EventValidationError

#: Avro's ``int`` is 32-bit and its ``long`` 64-bit, signed.  fastavro writes a Python int of
#: any size into either unchecked, and the projector's Arrow columns then refuse it, so every
#: integer field carries the bounds of its Avro type (the contract test checks each one).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
AvroInt = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
AvroLong = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Positive = Annotated[AvroInt, Field(ge=1)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _utc_millis(value: datetime) -> datetime:
    """Normalise to aware UTC with millisecond precision, as Avro timestamp-millis stores it."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    elif value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


class WorkflowStarted(_Frozen):
    """A workflow run began, or a read-only workflow was started over."""

    type: Literal["workflow_started"] = "workflow_started"
    name: str = ""
    attempt: Positive
    read_only: bool
    max_attempts: Positive = 5
    runner: str | None = None
    """The runner that made this claim; the first claim of an attempt owns the workflow."""
    app_version: str | None = None
    """The application's version that made this claim (``Settings.app_version``)."""
    stepledger_version: str | None = None
    """stepledger's version in the runner that made this claim (None before 0.4.0)."""
    restarted_from: str | None = None
    """The workflow this one restarts: its steps before ``restart_step`` replay its outcomes."""
    restart_step: str | None = None
    """The step from which a restart runs anew."""


class WorkflowResumed(_Frozen):
    """A workflow was re-entered after a crash or an exit."""

    type: Literal["workflow_resumed"] = "workflow_resumed"
    attempt: Positive
    reason: str | None = None
    runner: str | None = None
    """The runner that made this claim; the first claim of an attempt owns the workflow."""
    app_version: str | None = None
    """The application's version that made this claim (``Settings.app_version``)."""
    stepledger_version: str | None = None
    """stepledger's version in the runner that made this claim (None before 0.4.0)."""
    operator: str | None = None
    """The operator whose command (a cancel or a restart carried through) made this claim:
    it counts no resumption attempt (None: a runner's resume)."""


class WorkflowFinished(_Frozen):
    """A workflow ended."""

    type: Literal["workflow_finished"] = "workflow_finished"
    status: WorkflowStatus
    detail: str | None = None
    escalation_id: str | None = None
    left_standing_json: str | None = None
    runner: str | None = None
    """The runner that ended it, when an agent did; a fenced-off runner's end is an anomaly."""
    restarted_as: str | None = None
    """For ``restarted``: the workflow that runs on in its place."""


class WorkflowDeadLettered(_Frozen):
    """A workflow passed its resumption limit and waits for a human."""

    type: Literal["workflow_dead_lettered"] = "workflow_dead_lettered"
    attempt: AvroInt
    reason: str
    escalation_id: str


class StepIntended(_Frozen):
    """An effectful call is about to happen; acknowledged by Kafka before the call."""

    type: Literal["step_intended"] = "step_intended"
    sequence: Annotated[AvroInt, Field(ge=0)]
    tool: str
    effect: EffectClass
    policy: ResolutionPolicy
    idempotency_key: str
    arguments_json: str
    arguments_digest: str
    deadline: datetime
    attempt: Positive
    requires_approval: bool = False
    repeatable: bool | None = None
    undoable: bool | None = None
    after_pivot: bool = False
    epoch: Annotated[AvroInt, Field(ge=0)] = 0
    """The workflow attempt (claim) of the runner that wrote it; 0 before 0.3.0."""
    runner: str | None = None
    """The runner that wrote it (unique per process and handle); None before 0.3.0."""

    _deadline = field_validator("deadline")(_utc_millis)


class StepOutcome(_Frozen):
    """What a step's call produced."""

    type: Literal["step_outcome"] = "step_outcome"
    status: OutcomeStatus
    result_json: str | None = None
    error: str | None = None
    error_type: str | None = None
    source: Source
    evidence_json: str | None = None
    attempt: AvroInt = 1
    result_type: str | None = None
    runner: str | None = None
    """For an agent's outcome, the runner that made the call (None for recovery's)."""


class CompensationIntended(_Frozen):
    """A forward correcting action is about to run."""

    type: Literal["compensation_intended"] = "compensation_intended"
    idempotency_key: str
    reason: str
    source: Source
    deadline: datetime
    attempt: Annotated[AvroInt, Field(ge=0)] = 0
    """The step attempt it undoes (0 before 0.3.0: unchecked); keys survive a retry."""
    epoch: Annotated[AvroInt, Field(ge=0)] = 0
    """The claim (workflow attempt) of the runner that wrote it; 0 for the daemon's."""
    runner: str | None = None
    """The runner that wrote it (its saga, or a resolver settling for it); None for the daemon's."""

    _deadline = field_validator("deadline")(_utc_millis)


class CompensationOutcome(_Frozen):
    """What a compensation produced."""

    type: Literal["compensation_outcome"] = "compensation_outcome"
    status: CompensationStatus
    result_json: str | None = None
    error: str | None = None
    source: Source


class StepAbandoned(_Frozen):
    """Nobody resolves the step automatically any more; a human decides."""

    type: Literal["step_abandoned"] = "step_abandoned"
    reason: str
    escalation_id: str | None = None
    evidence_json: str | None = None
    source: Source


class ResolutionAttempted(_Frozen):
    """Recovery tried a hook on an in-doubt step: what it tried, what the tool answered."""

    type: Literal["resolution_attempted"] = "resolution_attempted"
    policy: ResolutionPolicy
    attempt: Positive
    answer_json: str | None = None
    error: str | None = None
    source: Source = Source.RECOVERY


class EscalationResolved(_Frozen):
    """A human answered an escalation; the step or workflow is re-judged from it."""

    type: Literal["escalation_resolved"] = "escalation_resolved"
    escalation_id: str
    verdict: Verdict
    result_json: str | None = None
    note: str = ""
    by: str
    auth: str | None = None
    """How the author named in ``by`` was authenticated (see ``AuthMethod``)."""


class ApprovalRequested(_Frozen):
    """A pivot step waits for a human approval of one exact call."""

    type: Literal["approval_requested"] = "approval_requested"
    tool: str
    reason: str | None = None
    arguments_json: str | None = None
    """The call's arguments as its intent will record them (secret values redacted)."""
    arguments_digest: str | None = None
    """The digest of the call's arguments: what an approval of this request binds."""
    saga_json: str | None = None
    """The saga's state when asked: what happened, what a denial leaves standing."""
    valid_for_s: Annotated[AvroInt, Field(ge=0)] = 0
    """How long an approval stays valid once given, in seconds; 0: it does not expire."""
    request: Positive = 1
    """Which request of the step this is: a new one voids the earlier ones."""


class ApprovalDecided(_Frozen):
    """A human granted or denied a pivot step."""

    type: Literal["approval_decided"] = "approval_decided"
    granted: bool
    by: str
    note: str | None = None
    arguments_digest: str | None = None
    """The digest of the call decided on (the request's): it binds nothing else."""
    auth: str | None = None
    """How the author named in ``by`` was authenticated (see ``AuthMethod``)."""
    request: Annotated[AvroInt, Field(ge=0)] = 0
    """Which request of the step this answers (0: an answer that names none)."""


class AnomalyObserved(_Frozen):
    """Something in the log or a tool service disagrees with the ledger."""

    type: Literal["anomaly_observed"] = "anomaly_observed"
    kind: str
    detail: str
    source: Source


class ModelTurnReused(_Frozen):
    """A run replayed a recorded model turn instead of asking the model: no tokens spent."""

    type: Literal["model_turn_reused"] = "model_turn_reused"
    attempt: Positive
    runner: str | None = None


class WorkflowPaused(_Frozen):
    """An operator paused the workflow: no new step starts; a step in flight finishes."""

    type: Literal["workflow_paused"] = "workflow_paused"
    by: str
    reason: str = ""
    auth: str | None = None
    """How the author named in ``by`` was authenticated (see ``AuthMethod``)."""
    pause: Positive = 1
    """Which pause of the workflow this is: two pauses by one person stay two events."""
    hold_recovery: bool = False
    """The pause holds recovery too: no in-doubt step of the workflow is settled until the
    unpause (without it recovery goes on settling them, the default)."""


class WorkflowUnpaused(_Frozen):
    """An operator unpaused the workflow: its next step may start."""

    type: Literal["workflow_unpaused"] = "workflow_unpaused"
    by: str
    reason: str = ""
    auth: str | None = None
    """How the author named in ``by`` was authenticated (see ``AuthMethod``)."""
    pause: Positive = 1
    """Which pause it lifts."""


class WorkflowCancelRequested(_Frozen):
    """An operator asked to cancel the workflow: no new step starts, its effects are undone."""

    type: Literal["workflow_cancel_requested"] = "workflow_cancel_requested"
    by: str
    reason: str = ""
    auth: str | None = None
    """How the author named in ``by`` was authenticated (see ``AuthMethod``)."""


class BudgetReserved(_Frozen):
    """On a fleet's budget topic: what a runner may spend on its next turn, if it fits.

    Whether it fits is decided by the topic's order (:mod:`stepledger.domain.fleetbudget`).
    """

    type: Literal["budget_reserved"] = "budget_reserved"
    tokens: Annotated[AvroLong, Field(ge=0)]
    cost: float = Field(ge=0)
    limit_tokens: Annotated[AvroLong, Field(ge=0)] | None = None
    """The fleet's token budget the runner applies (None: none)."""
    limit_cost: float | None = Field(default=None, ge=0)
    """The fleet's cost budget the runner applies (None: none)."""
    runner: str | None = None


class BudgetSettled(_Frozen):
    """On a fleet's budget topic: what a reservation's turn spent (replaces its estimate)."""

    type: Literal["budget_settled"] = "budget_settled"
    reservation: str = Field(min_length=1)
    """The event id of the reservation."""
    tokens: Annotated[AvroLong, Field(ge=0)]
    cost: float = Field(ge=0)


class BudgetRaised(_Frozen):
    """On a fleet's budget topic: a person raised the fleet's budget (an answer)."""

    type: Literal["budget_raised"] = "budget_raised"
    tokens: Annotated[AvroLong, Field(ge=0)] = 0
    cost: float = Field(default=0.0, ge=0)
    by: str
    auth: str | None = None
    note: str | None = None


Body = Annotated[
    WorkflowStarted
    | WorkflowResumed
    | WorkflowFinished
    | WorkflowDeadLettered
    | StepIntended
    | StepOutcome
    | CompensationIntended
    | CompensationOutcome
    | StepAbandoned
    | ResolutionAttempted
    | EscalationResolved
    | ApprovalRequested
    | ApprovalDecided
    | AnomalyObserved
    | ModelTurnReused
    | WorkflowPaused
    | WorkflowUnpaused
    | WorkflowCancelRequested
    | BudgetReserved
    | BudgetSettled
    | BudgetRaised,
    Field(discriminator="type"),
]

BODY_TYPES: tuple[type[BaseModel], ...] = (
    WorkflowStarted,
    WorkflowResumed,
    WorkflowFinished,
    WorkflowDeadLettered,
    StepIntended,
    StepOutcome,
    CompensationIntended,
    CompensationOutcome,
    StepAbandoned,
    ResolutionAttempted,
    EscalationResolved,
    ApprovalRequested,
    ApprovalDecided,
    AnomalyObserved,
    ModelTurnReused,
    WorkflowPaused,
    WorkflowUnpaused,
    WorkflowCancelRequested,
    BudgetReserved,
    BudgetSettled,
    BudgetRaised,
)

EventType = Literal[
    "workflow_started",
    "workflow_resumed",
    "workflow_finished",
    "workflow_dead_lettered",
    "step_intended",
    "step_outcome",
    "compensation_intended",
    "compensation_outcome",
    "step_abandoned",
    "resolution_attempted",
    "escalation_resolved",
    "approval_requested",
    "approval_decided",
    "anomaly_observed",
    "model_turn_reused",
    "workflow_paused",
    "workflow_unpaused",
    "workflow_cancel_requested",
    "budget_reserved",
    "budget_settled",
    "budget_raised",
]


class Event(_Frozen):
    """The envelope of every event; the Kafka key is ``workflow_id``."""

    event_id: str = Field(min_length=1)
    workflow_id: str = Field(min_length=1)
    step_id: str | None = None
    fleet_id: str = Field(min_length=1)
    producer_id: str = Field(min_length=1)
    occurred_at: datetime
    body: Body

    _occurred_at = field_validator("occurred_at")(_utc_millis)

    @property
    def type(self) -> EventType:
        """The body's type tag, e.g. ``step_intended``."""
        return self.body.type


M = TypeVar("M", bound=BaseModel)


def avro_int(name: str, value: int, low: int = INT32_MIN) -> int:
    """Return ``value`` if it fits Avro's ``int`` and is at least ``low``; else raise."""
    if type(value) is not int or not low <= value <= INT32_MAX:
        raise EventValidationError(f"{name}={value!r} is not an Avro int >= {low}")
    return value


def utc_millis(value: datetime) -> datetime:
    """Normalise a time as every event stores it (aware UTC, millisecond precision)."""
    return _utc_millis(value)


def trusted(model: type[M], values: dict[str, Any]) -> M:
    """Build a model from values the SDK computed itself, without validating them again.

    Only for values whose types the caller guarantees (times normalised by
    :func:`utc_millis`, integers checked by :func:`avro_int`, strings, enums, bools): a
    test decodes what this builds with the strict model (``Event.model_validate``) and
    compares.  Missing fields take their defaults, as validation would give them.
    """
    obj = object.__new__(model)
    state = {**_DEFAULTS[model], **values}
    object.__setattr__(obj, "__dict__", state)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    return {n: f.default for n, f in model.model_fields.items() if not f.is_required()}


_TRUSTED: tuple[type[BaseModel], ...] = (*BODY_TYPES, Event)
_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {m: _defaults(m) for m in _TRUSTED}

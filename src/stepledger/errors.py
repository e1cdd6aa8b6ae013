"""The one exception tree of stepledger.

::

    StepLedgerError                      root; ``retryable`` says whether trying again can help
    ├── ConfigError                      bad settings, flags, config file or environment
    ├── ToolDefinitionError              an invalid Tool spec, refused at definition time
    │   └── ResultTypeError              a result that would not replay as it was returned
    ├── CodecError                       bytes that are not a valid event
    │   └── UnknownSchemaError           a fingerprint or registry id no known schema has
    ├── EventValidationError             a decoded or JSON event that breaks the model
    │   └── ForeignFleetError            an event claiming another fleet than its step log's
    ├── BrokerError                      the event log cannot be reached or refused a request
    │   ├── NotAuthorisedError           the broker refused this principal an ACL (one line)
    │   └── DurabilityError              a record was not acknowledged: the effect was not attempted
    │       ├── RecordTooLargeError      a record larger than its topic takes (never written)
    │       └── RecordRefusedError       a record the broker refused this principal (also the above)
    ├── LedgerStateError                 the log forbids what was asked
    │   ├── PlanMismatchError            a replayed plan asks for another step at a known position
    │   ├── SagaViolationError           a plan or step that breaks the saga rules (pivot order)
    │   ├── ApprovalPendingError         a pivot step waits for a human approval
    │   ├── ApprovalDeniedError          a human denied a pivot step
    │   ├── ApprovalMismatchError        an answer names another call than the one awaiting approval
    │   ├── StepInDoubtError             a step's outcome is unknown and must be resolved first
│   ├── StepCompensatedError         the log's first decision for a step undid its effect
    │   ├── WorkflowDeadLetteredError    the workflow exceeded its resumption limit
    │   ├── HistoryExpiredError          the log's head expired and no checkpoint covers it
    │   ├── WorkflowTakenOverError       another runner claimed the workflow: nothing was called
    │   ├── WorkflowPausedError          an operator paused the workflow: no new step starts
    │   │   └── WorkflowCancelledError   an operator asked to cancel it: this runner stops
    │   ├── AlreadyAnsweredError         a person's answer came after the case was decided
    │   └── BudgetExceededError          a model call would pass its workflow's or fleet's budget
    ├── InvalidAnswerError               a person's answer lacks a name or comment, or bad JSON
    ├── ToolCallError                    a tool raised; the failed outcome is recorded
    ├── ToolServiceError                 a tool's service refused a call or could not be reached
    ├── RecoveryError                    recovery could not do what was asked
    │   ├── OwnershipLostError           the partition may have moved: no decision is appended
│   ├── HookTimeoutError             a recovery hook did not answer within the tool's timeout
    │   ├── ToolRegistryError            a tool registry could not be loaded or lacks a tool
    │   └── UnknownEscalationError       no open escalation has the given id
    └── ViewStoreError                   the DuckDB view store failed or refused a statement
        └── ReadOnlyQueryError           a write statement was sent to the read-only query path

One warning beside the tree: ``UnrecordedToolWarning`` (a ``UserWarning``), a framework
tool that is not a stepledger step (an integration's ``strict=True`` refuses it instead,
with ``ToolDefinitionError``).
"""

from __future__ import annotations

from datetime import datetime


class StepLedgerError(Exception):
    """Root of every error stepledger raises on purpose."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        workflow_id: str | None = None,
        step_id: str | None = None,
        tool: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.workflow_id = workflow_id
        self.step_id = step_id
        self.tool = tool
        if retryable is not None:
            self.retryable = retryable


class ConfigError(StepLedgerError):
    """Settings, flags, a config file or the environment are invalid."""


class ToolDefinitionError(StepLedgerError):
    """A Tool spec combines settings that cannot work together."""


class ResultTypeError(ToolDefinitionError):
    """A tool's result would not come back from the log equal and of the same type.

    Raised when a tool is defined with a result type the SDK cannot record and replay,
    when a call returns a value its tool cannot round-trip (the outcome is recorded, marked
    not replayable), and when a replay meets such a result or one recorded as another type.
    """


class CodecError(StepLedgerError):
    """Bytes could not be turned into an event (or an event into bytes)."""


class UnknownSchemaError(CodecError):
    """The value names a schema (fingerprint or registry id) this reader does not know."""


class EventValidationError(StepLedgerError):
    """An event does not satisfy the event model."""


class ForeignFleetError(EventValidationError):
    """An event names another fleet than the one whose step log it is in (a misconfigured or
    hostile client): refused by every reader pinned to the fleet, never applied."""


class BrokerError(StepLedgerError):
    """The Kafka event log could not be reached or refused a request."""

    retryable = True


class DurabilityError(BrokerError):
    """A record was not acknowledged by the broker, so the guarded effect was not attempted."""


class RecordTooLargeError(DurabilityError):
    """The broker (or the producer) refused a record as larger than its topic takes.

    The record was not written, and sending it again fails the same way: what it records
    must be made smaller (a result kept as its digest), or the attempt counted and given up.
    """

    retryable = False


class NotAuthorisedError(BrokerError):
    """The broker refused this principal: it lacks an ACL, or its credentials were refused.

    The message is one line, ``not authorised: <role> lacks <ACL> on <resource>``; trying
    again helps only once an operator changed the ACLs or the credentials.
    """

    retryable = False

    def __init__(self, message: str, *, role: str, acl: str, resource: str) -> None:
        super().__init__(message, retryable=False)
        self.role = role
        self.acl = acl
        self.resource = resource


class RecordRefusedError(DurabilityError, NotAuthorisedError):
    """A record the broker refused this principal: not written, the effect not attempted."""

    retryable = False


class LedgerStateError(StepLedgerError):
    """What was asked contradicts the recorded log."""


class WorkflowTakenOverError(LedgerStateError):
    """Another runner claimed the workflow after this one: this runner calls nothing more.

    Raised before any effect of the runner (an effectful step call, keyed or not; a saga's
    compensation; a compensation while it settles a step) when its own claim (the intent,
    the compensation intent), read back in log order, came after a newer claim (or lost to
    a competing one), and when a resume finds that its claim was not the first of its
    attempt.
    """


class BudgetExceededError(LedgerStateError):
    """The workflow (or its fleet) spent its model budget: the next model call is not made.

    Raised before the call, so nothing was spent on it; a replayed turn is never refused
    (it spends nothing).  ``spent_tokens`` and ``spent_cost`` are the workflow's recorded
    turns (or what the fleet's budget topic has committed, when ``fleet_id`` is set),
    ``limit`` the budget that stopped it.
    """

    def __init__(
        self,
        message: str,
        *,
        workflow_id: str,
        spent_tokens: int,
        spent_cost: float,
        limit: str,
        fleet_id: str | None = None,
    ) -> None:
        super().__init__(message, workflow_id=workflow_id, retryable=False)
        self.spent_tokens = spent_tokens
        self.spent_cost = spent_cost
        self.limit = limit
        self.fleet_id = fleet_id


class AlreadyAnsweredError(LedgerStateError):
    """The case was already decided: the log holds an earlier answer, which stands."""

    def __init__(
        self,
        message: str,
        *,
        by: str,
        at: datetime | None,
        answer: str,
        workflow_id: str | None = None,
        step_id: str | None = None,
    ) -> None:
        super().__init__(message, workflow_id=workflow_id, step_id=step_id)
        self.by = by
        self.at = at
        self.answer = answer


class InvalidAnswerError(StepLedgerError):
    """A person's answer is incomplete or malformed (no name, no comment, a result not JSON)."""


class PlanMismatchError(LedgerStateError):
    """A replayed plan asked for a different step than the log recorded."""


class SagaViolationError(LedgerStateError):
    """A plan or a step breaks the saga rules (an undoable step after the pivot, ...).

    ``escalation_id`` is set when the refusal was recorded in the log for a person (a step
    refused at run time: the workflow is dead-lettered until they clear it).
    """

    def __init__(
        self,
        message: str,
        *,
        outstanding: tuple[str, ...] = (),
        escalation_id: str | None = None,
        **kw: object,
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.outstanding = outstanding
        self.escalation_id = escalation_id


class ApprovalPendingError(LedgerStateError):
    """A pivot step waits for a human approval that is not in the log yet."""

    retryable = True


class ApprovalDeniedError(LedgerStateError):
    """A human denied a pivot step: it will not run."""


class ApprovalMismatchError(LedgerStateError):
    """An approval answers another call than the one the step now awaits approval for.

    Raised when a person's answer names a digest (the inbox page they saw, ``approve
    --digest``) that is not the pending request's: the agent asked again with other
    arguments since, and the answer would approve what was not shown.
    """


class StepInDoubtError(LedgerStateError):
    """A step has an intent but no outcome and must be resolved before going on."""

    retryable = True

    def __init__(self, message: str, *, escalation_id: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.escalation_id = escalation_id


class StepCompensatedError(LedgerStateError):
    """The log's first decision for a step is a compensation: its effect is (being) undone.

    Raised when an agent asks for a step that recovery (or an earlier run) compensated, also
    when the agent's own call ended after that decision was recorded.  The step does not run
    again; the agent goes on without its effect, typically by compensating the workflow.
    """

    def __init__(
        self, message: str, *, decision: str = "", decided_by: str | None = None, **kw: object
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.decision = decision
        """The step's status in the log: compensating, compensated or compensation_failed."""
        self.decided_by = decided_by
        """Who decided the compensation (an event source: recovery_compensate, agent, human)."""


class WorkflowDeadLetteredError(LedgerStateError):
    """The workflow passed its resumption limit and waits for a human."""

    def __init__(self, message: str, *, escalation_id: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.escalation_id = escalation_id


class WorkflowPausedError(LedgerStateError):
    """An operator paused the workflow: the step did not start (nothing was called).

    ``by`` names who paused it; ``stepledger workflows unpause`` lets the next step start.
    Retrying helps once it is unpaused (``retryable``).
    """

    retryable = True

    def __init__(self, message: str, *, by: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.by = by


class WorkflowCancelledError(WorkflowPausedError):
    """An operator asked to cancel the workflow: this runner starts no step and stops."""

    retryable = False


class HistoryExpiredError(LedgerStateError):
    """The broker deleted the head of a workflow's partition and no checkpoint covers it.

    Whether the workflow ran before cannot be known, so it is neither resumed from a part
    of its history nor started as new (which would repeat its effects).
    """

    def __init__(
        self, message: str, *, topic: str, partition: int, log_start: int, **kw: object
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.topic = topic
        self.partition = partition
        self.log_start = log_start


class ToolCallError(StepLedgerError):
    """A tool raised; its failed outcome is in the log and the original error is chained."""


class ToolServiceError(StepLedgerError):
    """A tool's service answered with an error or could not be reached (effect maybe unknown).

    ``effect_unknown`` is True when the call may have taken effect anyway (a timeout, a
    connection lost after sending, a 5xx): the SDK then leaves the step in doubt for its
    resolution policy instead of recording a failure that a retry would repeat.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        effect_unknown: bool = False,
        **kw: object,
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status
        self.effect_unknown = effect_unknown


def effect_unknown(exc: BaseException) -> bool:
    """True when a tool's error leaves open whether its effect happened.

    Timeouts and connections lost mid-call are unknown; a refused connection never sent
    the request.  Tools can say so on their own errors with an ``effect_unknown`` attribute.
    """
    if isinstance(exc, ConnectionRefusedError):
        return False
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    return bool(getattr(exc, "effect_unknown", False))


class RecoveryError(StepLedgerError):
    """The recovery of an in-doubt step could not do what was asked."""


class OwnershipLostError(RecoveryError):
    """A daemon may no longer own the step's partition: it appends no decision for it."""

    retryable = True


class HookTimeoutError(RecoveryError):
    """A recovery hook did not answer within the tool's timeout (its thread may still run)."""

    retryable = True


class ToolRegistryError(RecoveryError):
    """A tool registry could not be loaded, or a tool is not in it."""


class UnknownEscalationError(RecoveryError):
    """No open escalation has the given id."""


class ViewStoreError(StepLedgerError):
    """The DuckDB view store failed."""


class ReadOnlyQueryError(ViewStoreError):
    """A statement that writes was sent to the read-only query path."""


class UnrecordedToolWarning(UserWarning):
    """A framework tool beside the ledger's whose calls are not steps: a resume may repeat them."""

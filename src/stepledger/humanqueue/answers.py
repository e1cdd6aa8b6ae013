"""A person's answer to a case: checked against the log, appended, and read back.

The events appended are the ones the CLI appends, through the same functions:
:func:`stepledger.humanqueue.escalations.answer` (``escalations resolve``, ``workflows
clear``) and :func:`stepledger.producer.approval.decide` (``approve``/``deny``).  Around
them:

1. **check**: the workflow is read (snapshot plus tail) and folded; a case that was
   already decided is refused with who decided it and when, and nothing is appended;
2. **append**, one answer at a time per case within this process;
3. **read back**: the workflow is read again and folded.  The log decides, not this
   process: the fold applies the *first* answer for an open case and records later ones
   as anomalies, so two people answering at once (from two inboxes, or the CLI) learn
   whose answer counted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.approvals import AuthMethod
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory
from stepledger.errors import (
    AlreadyAnsweredError,
    InvalidAnswerError,
    LedgerStateError,
    UnknownEscalationError,
)
from stepledger.history.adapt import WorkflowReader, as_history
from stepledger.history.protocol import WorkflowHistory
from stepledger.humanqueue import escalations
from stepledger.humanqueue.cases import Answer, Case, Decision, approval_case, escalation_case
from stepledger.humanqueue.shown import Redactor
from stepledger.log import EventLog
from stepledger.producer import approval

CLI_NOTE = "answered from the command line"
"""The comment a command-line answer records when none is given."""
MAX_NAME = 120
MAX_NOTE = 4000
MAX_RESULT = 64_000


@dataclass(frozen=True)
class Receipt:
    """What became of an answer once the log was read back."""

    event: ev.Event
    """The event this answer appended."""
    case: Case
    """The case as the log tells it after the append."""

    @property
    def counted(self) -> bool:
        """True when this answer is the one the log applied."""
        decision = self.case.decision
        return decision is not None and decision.event_id == self.event.event_id

    @property
    def decision(self) -> Decision | None:
        """The answer that counted (this one, or an earlier one)."""
        return self.case.decision


def validate(by: str, note: str) -> tuple[str, str]:
    """The name and comment, stripped; InvalidAnswerError when either is missing or too long."""
    by, note = by.strip(), note.strip()
    if not by:
        raise InvalidAnswerError("a name is required: who answers?")
    if not note:
        raise InvalidAnswerError("a comment is required: what did you check?")
    if len(by) > MAX_NAME or len(note) > MAX_NOTE:
        raise InvalidAnswerError(f"a name holds at most {MAX_NAME} and a comment {MAX_NOTE} chars")
    return by, note


def parse_result(text: str) -> Any:
    """A "happened" answer's result: JSON text, empty for none; InvalidAnswerError if not JSON."""
    if not text.strip():
        return None
    if len(text) > MAX_RESULT:
        raise InvalidAnswerError(f"the result holds at most {MAX_RESULT} characters")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidAnswerError(f"the result is not valid JSON: {exc}") from None


class Answerer:
    """Answers cases through the CLI's functions: checked before, one at a time, read back."""

    def __init__(
        self,
        log: EventLog,
        factory: EventFactory,
        history: WorkflowHistory | WorkflowReader,
        redactor: Redactor | None = None,
    ) -> None:
        self.log = log
        self.factory = factory
        self.history = as_history(history)
        self.redactor = redactor
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def escalation_case(self, workflow_id: str, escalation_id: str) -> Case | None:
        """The escalation's case as the log tells it now."""
        events = self.history.read(workflow_id).events
        return escalation_case(workflow_id, escalation_id, events, self.redactor)

    def approval_case(self, workflow_id: str, step_id: str) -> Case | None:
        """The approval's case as the log tells it now."""
        return approval_case(
            workflow_id, step_id, self.history.read(workflow_id).events, self.redactor
        )

    def answer_escalation(
        self,
        workflow_id: str,
        escalation_id: str,
        verdict: Verdict,
        *,
        by: str,
        note: str,
        result: Any = None,
        auth: AuthMethod | None = None,
    ) -> Receipt:
        """Append a verdict on an open escalation (what ``escalations resolve`` appends)."""
        by, note = validate(by, note)
        with self._lock(escalation_id):
            events = self.history.read(workflow_id).events
            case = escalation_case(workflow_id, escalation_id, events, self.redactor)
            _ensure_open(case, escalation_id)
            try:
                item = escalations.EscalationQueue().extend(events).get(escalation_id)
            except UnknownEscalationError:
                raise _unknown(escalation_id) from None
            event = escalations.answer(
                self.log,
                self.factory,
                item,
                verdict,
                by=by,
                note=note,
                result=result,
                auth=None if auth is None else auth.value,
            )
        return self._read_back(event, lambda: self.escalation_case(workflow_id, escalation_id))

    def answer_approval(
        self,
        workflow_id: str,
        step_id: str,
        *,
        granted: bool,
        by: str,
        note: str,
        digest: str | None = None,
        auth: AuthMethod | None = None,
    ) -> Receipt:
        """Grant or deny a pending approval (what ``approve``/``deny`` append).

        ``digest`` is the call the person saw (the page's, ``--digest``): when the step now
        awaits approval of another call, ApprovalMismatchError is raised, nothing appended.
        """
        by, note = validate(by, note)
        with self._lock(f"{workflow_id}\x1f{step_id}"):
            case = self.approval_case(workflow_id, step_id)
            if case is None:
                raise LedgerStateError(
                    f"workflow {workflow_id!r} step {step_id!r} awaits no approval "
                    "(no approval was requested)",
                    workflow_id=workflow_id,
                    step_id=step_id,
                )
            _ensure_open(case, f"{workflow_id}/{step_id}")
            event = approval.decide(
                self.log,
                self.factory,
                self.history,
                workflow_id,
                step_id,
                granted=granted,
                by=by,
                note=note,
                digest=digest,
                auth=None if auth is None else auth.value,
            )
        return self._read_back(event, lambda: self.approval_case(workflow_id, step_id))

    def _read_back(self, event: ev.Event, read: Callable[[], Case | None]) -> Receipt:
        case = read()
        if case is None:  # the reader lost the workflow: it cannot, the event was acknowledged
            raise _unknown(event.workflow_id)
        return Receipt(event, case)

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())


def ensure_counted(receipt: Receipt) -> None:
    """Raise AlreadyAnsweredError when someone else's answer came first in the log."""
    decision = receipt.decision
    if receipt.counted or decision is None:
        return
    case = receipt.case
    raise already_answered(decision, case, " (yours came second and does not count)")


def already_answered(decision: Decision, case: Case, tail: str = "") -> AlreadyAnsweredError:
    """The refusal naming who answered a case first, and when."""
    return AlreadyAnsweredError(
        f"already answered by {decision.by} at {decision.at.isoformat(timespec='seconds')}: "
        f"{decision.answer.value}{tail}",
        by=decision.by,
        at=decision.at,
        answer=decision.answer.value,
        workflow_id=case.workflow_id,
        step_id=case.step_id,
    )


def _ensure_open(case: Case | None, name: str) -> None:
    if case is None:
        raise _unknown(name)
    if case.is_open:
        return
    decision = case.decision
    if decision is None:
        raise AlreadyAnsweredError(
            f"{name} is no longer open: the log moved on without an answer",
            by="",
            at=None,
            answer="",
            workflow_id=case.workflow_id,
            step_id=case.step_id,
        )
    raise already_answered(decision, case)


def _unknown(name: str) -> UnknownEscalationError:
    return UnknownEscalationError(f"no case {name!r} in the log")


def answer_kind(answer: Answer) -> Verdict | bool:
    """The verdict an answer appends, or for an approval whether it is granted."""
    if answer is Answer.APPROVE:
        return True
    if answer is Answer.DENY:
        return False
    return Verdict(answer.value)

"""Builders of well-formed events with deterministic ids (pure: the clock is passed in).

The per-step events (an intent, an outcome) are built on every agent's critical path, from
values this module computes itself or that were validated where the user gave them (a
``Tool`` when it was defined, ids here, once): they are constructed without running
pydantic's validation again (:func:`~stepledger.domain.events.trusted`), and the tests
decode what they produce with the strict model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.ids import canonical_json, event_id, idempotency_key
from stepledger.domain.secrets import RedactionKey, Scrubber
from stepledger.domain.state import version_words
from stepledger.domain.tools import Tool
from stepledger.errors import EventValidationError

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The wall clock in UTC."""
    return datetime.now(UTC)


def _content(body: ev.Body) -> str:
    data = body.model_dump(mode="json")
    times = {k for k, v in body.__dict__.items() if isinstance(v, datetime)}
    return canonical_json({k: v for k, v in data.items() if k not in times})


@dataclass(frozen=True)
class EventFactory:
    """Makes the events of one producer: envelope fields filled, ids derived, never random."""

    fleet_id: str
    producer_id: str
    clock: Clock = utc_now
    redaction_key: RedactionKey | None = field(default=None, repr=False, compare=False)
    """Keys the markers of secret arguments; without it they are a fixed marker."""
    app_version: str | None = None
    """The application's version every claim records (``Settings.app_version``)."""
    stepledger_version: str | None = None
    """stepledger's own version every claim records beside it."""

    def __post_init__(self) -> None:
        for name in ("fleet_id", "producer_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise EventValidationError(f"{name} must be a non-empty string, not {value!r}")

    def versions(self) -> str:
        """This producer's application and stepledger versions, in words (for errors)."""
        return version_words(self.app_version, self.stepledger_version)

    def envelope(
        self, workflow_id: str, step_id: str | None, body: ev.Body, *qualifiers: object
    ) -> ev.Event:
        """Wrap a body; its id is derived from workflow, step, type and the qualifiers.

        Without qualifiers the body's content (minus its times) is the qualifier, so the
        same decision made twice is the same event, and two different ones never collide.
        """
        if not qualifiers:
            qualifiers = (_content(body),)
        eid = event_id(workflow_id, step_id, body.type, *qualifiers)
        return self._wrap(workflow_id, step_id, body, eid)

    def _wrap(
        self,
        workflow_id: str,
        step_id: str | None,
        body: ev.Body,
        eid: str,
        now: datetime | None = None,
    ) -> ev.Event:
        _check_ids(workflow_id, step_id)
        values = {
            "event_id": eid,
            "workflow_id": workflow_id,
            "step_id": step_id,
            "fleet_id": self.fleet_id,
            "producer_id": self.producer_id,
            "occurred_at": ev.utc_millis(self.clock()) if now is None else now,
            "body": body,
        }
        return ev.trusted(ev.Event, values)

    def recorded_arguments(
        self, workflow_id: str, step_id: str, tool: Tool, arguments: Mapping[str, Any]
    ) -> tuple[str, str]:
        """A call's arguments as an intent records them (secrets marked) and its fingerprint.

        The fingerprint (tool, step, identifying arguments with secrets as keyed marks) is
        what the intent, an approval request and the plan check record and compare.
        """
        return tool.recorded_arguments(
            arguments, workflow_id=workflow_id, step_id=step_id, key=self.redaction_key
        )

    def fingerprint(
        self, workflow_id: str, step_id: str, tool: Tool, arguments: Mapping[str, Any]
    ) -> str:
        """The call's fingerprint (see :meth:`recorded_arguments`)."""
        return self.recorded_arguments(workflow_id, step_id, tool, arguments)[1]

    def workflow_started(
        self,
        workflow_id: str,
        *,
        name: str,
        attempt: int,
        read_only: bool,
        max_attempts: int,
        runner: str | None = None,
        restarted_from: str | None = None,
        restart_step: str | None = None,
    ) -> ev.Event:
        """A workflow's first run, or a read-only workflow's restart: a claim of ``attempt``."""
        body = ev.WorkflowStarted(
            name=name,
            attempt=attempt,
            read_only=read_only,
            max_attempts=max_attempts,
            runner=runner,
            app_version=self.app_version,
            stepledger_version=self.stepledger_version,
            restarted_from=restarted_from,
            restart_step=restart_step,
        )
        return self.envelope(workflow_id, None, body, *_claimed(attempt, runner))

    def workflow_resumed(
        self,
        workflow_id: str,
        *,
        attempt: int,
        reason: str | None,
        runner: str | None = None,
        operator: str | None = None,
    ) -> ev.Event:
        """A resume: the runner claims the workflow as ``attempt`` (its epoch); ``operator``
        names who steers it (a cancel or restart carried through: no attempt counted)."""
        body = ev.WorkflowResumed(
            attempt=attempt,
            reason=reason,
            runner=runner,
            app_version=self.app_version,
            stepledger_version=self.stepledger_version,
            operator=operator,
        )
        return self.envelope(workflow_id, None, body, *_claimed(attempt, runner))

    def intent(
        self,
        workflow_id: str,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any],
        *,
        sequence: int,
        attempt: int = 1,
        after_pivot: bool = False,
        key: str | None = None,
        epoch: int = 0,
        runner: str | None = None,
    ) -> ev.Event:
        """The intent of one call: key derived, secrets redacted, deadline from the timeout.

        ``after_pivot``: a pivot of the workflow may have happened before this call, so
        recovery must never compensate it (see :mod:`stepledger.domain.saga`).  ``key``:
        the idempotency key an earlier attempt used, kept after a "not happened"
        (invariant 17); derived from the attempt otherwise.  ``epoch`` and ``runner`` say
        which claim and runner wrote it: two runners' intents never share an event id.
        """
        if key is None:
            key = idempotency_key(workflow_id, step_id, tool.name, attempt)
        now = ev.utc_millis(self.clock())  # one reading: the deadline is occurred_at + timeout
        arguments_json, digest = self.recorded_arguments(workflow_id, step_id, tool, arguments)
        values = {
            "sequence": ev.avro_int("sequence", sequence, 0),
            "tool": tool.name,
            "effect": tool.effect_class,
            "policy": tool.resolution,
            "idempotency_key": key,
            "arguments_json": arguments_json,
            "arguments_digest": digest,
            "deadline": ev.utc_millis(now + timedelta(seconds=tool.timeout_s)),
            "attempt": ev.avro_int("attempt", attempt, 1),
            "requires_approval": tool.requires_approval,
            "repeatable": tool.repeatable,
            "undoable": tool.undoable,
            "after_pivot": bool(after_pivot),
            "epoch": ev.avro_int("epoch", epoch, 0),
            "runner": _optional_text("runner", runner),
        }
        body = ev.trusted(ev.StepIntended, values)
        eid = event_id(workflow_id, step_id, body.type, attempt, *_by(runner))
        return self._wrap(workflow_id, step_id, body, eid, now)

    def outcome(
        self,
        workflow_id: str,
        step_id: str,
        *,
        attempt: int,
        status: OutcomeStatus,
        source: Source = Source.AGENT,
        result: Any = None,
        error: BaseException | str | None = None,
        evidence: Any = None,
        scrub: Scrubber | None = None,
        result_type: str | None = None,
        runner: str | None = None,
        qualifiers: tuple[object, ...] | None = None,
    ) -> ev.Event:
        """The outcome of one intent attempt, from whoever decided it.

        ``scrub`` removes the call's secret values from the result and the error text;
        ``result`` is JSON-ready (see :class:`~stepledger.domain.results.ResultCodec`) and
        ``result_type`` names the codec that made it so.  ``qualifiers`` derive the id
        instead of the attempt, source and runner (recovery's: one id per decided attempt,
        whichever of its paths decided it).
        """
        text = None if error is None else str(error)
        if scrub:
            result = scrub.value(result)
            text = None if text is None else scrub.text(text)
        source = Source(source)
        values = {
            "status": OutcomeStatus(status),
            "result_json": None if result is None else canonical_json(result),
            "error": text,
            "error_type": type(error).__name__ if isinstance(error, BaseException) else None,
            "source": source,
            "evidence_json": None if evidence is None else canonical_json(evidence),
            "attempt": ev.avro_int("attempt", attempt),
            "result_type": None if result is None else _optional_text("result_type", result_type),
            "runner": _optional_text("runner", runner),
        }
        body = ev.trusted(ev.StepOutcome, values)
        if qualifiers is None:
            qualifiers = (attempt, source.value, *_by(runner))
        eid = event_id(workflow_id, step_id, body.type, *qualifiers)
        return self._wrap(workflow_id, step_id, body, eid)


def _by(runner: str | None) -> tuple[str, ...]:
    """The runner as an id qualifier (none before 0.3.0: those ids stay as they were)."""
    return () if runner is None else (runner,)


def _claimed(attempt: int, runner: str | None) -> tuple[object, ...]:
    return (attempt, *_by(runner))


def _check_ids(workflow_id: object, step_id: object) -> None:
    """The ids a caller gives, checked once where the event that carries them is built."""
    if not isinstance(workflow_id, str) or not workflow_id:
        raise EventValidationError(f"workflow id must be a non-empty string, not {workflow_id!r}")
    if step_id is not None and not isinstance(step_id, str):
        raise EventValidationError(f"step id must be a string, not {step_id!r}")


def _optional_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise EventValidationError(f"{name} must be a string, not {value!r}")
    return value

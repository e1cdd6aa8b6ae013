"""Builders of well-formed events with deterministic ids (pure: the clock is passed in)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.ids import canonical_json, event_id, idempotency_key
from stepledger.domain.secrets import RedactionKey, Scrubber
from stepledger.domain.tools import Tool

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

    def envelope(
        self, workflow_id: str, step_id: str | None, body: ev.Body, *qualifiers: object
    ) -> ev.Event:
        """Wrap a body; its id is derived from workflow, step, type and the qualifiers.

        Without qualifiers the body's content (minus its times) is the qualifier, so the
        same decision made twice is the same event, and two different ones never collide.
        """
        if not qualifiers:
            qualifiers = (_content(body),)
        return ev.Event(
            event_id=event_id(workflow_id, step_id, body.type, *qualifiers),
            workflow_id=workflow_id,
            step_id=step_id,
            fleet_id=self.fleet_id,
            producer_id=self.producer_id,
            occurred_at=self.clock(),
            body=body,
        )

    def workflow_started(
        self, workflow_id: str, *, name: str, attempt: int, read_only: bool, max_attempts: int
    ) -> ev.Event:
        """A workflow's first run, or a read-only workflow's restart."""
        body = ev.WorkflowStarted(
            name=name, attempt=attempt, read_only=read_only, max_attempts=max_attempts
        )
        return self.envelope(workflow_id, None, body, attempt)

    def intent(
        self,
        workflow_id: str,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any],
        *,
        sequence: int,
        attempt: int = 1,
    ) -> ev.Event:
        """The intent of one call: key derived, secrets redacted, deadline from the timeout."""
        key = idempotency_key(workflow_id, step_id, tool.name, attempt)
        recorded = tool.redact(arguments, key, self.redaction_key)
        body = ev.StepIntended(
            sequence=sequence,
            tool=tool.name,
            effect=tool.effect,
            policy=tool.resolution,
            idempotency_key=key,
            arguments_json=canonical_json(recorded),
            arguments_digest=tool.arguments_digest(arguments),
            deadline=self.clock() + timedelta(seconds=tool.timeout_s),
            attempt=attempt,
            requires_approval=tool.requires_approval,
        )
        return self.envelope(workflow_id, step_id, body, attempt)

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
    ) -> ev.Event:
        """The outcome of one intent attempt, from whoever decided it.

        ``scrub`` removes the call's secret values from the result and the error text.
        """
        text = None if error is None else str(error)
        if scrub:
            result = scrub.value(result)
            text = None if text is None else scrub.text(text)
        body = ev.StepOutcome(
            status=status,
            result_json=None if result is None else canonical_json(result),
            error=text,
            error_type=type(error).__name__ if isinstance(error, BaseException) else None,
            source=source,
            evidence_json=None if evidence is None else canonical_json(evidence),
            attempt=attempt,
        )
        return self.envelope(workflow_id, step_id, body, attempt, source.value)

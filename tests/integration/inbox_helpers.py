"""Workflows that leave cases for the inbox: escalated steps, dead letters, pending approvals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.approval_saga import saga_json
from stepledger.domain.enums import OutcomeStatus, ResolutionPolicy, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.secrets import RedactionKey
from stepledger.domain.state import replay
from stepledger.domain.tools import Found, Tool

#: A card number that must never appear on any page: the SDK records only a marker.
CARD = "4111 1111 1111 1111"

QUOTE = Tool(name="quote", effect="read_only", run=lambda args, key: {"price": 420})
HOLD = Tool(
    name="hold_room",
    effect="compensatable",
    run=lambda args, key: {"hold": key},
    compensate=lambda args, key, known: None,
)
WIRE = Tool(
    name="send_wire",
    effect="irreversible",
    secret_args=frozenset({"card"}),
    run=lambda args, key: {"wire": key},
)
LOOKUP = Tool(
    name="charge_card",
    effect="idempotent",
    keyed=True,
    policy="query",
    secret_args=frozenset({"card"}),
    run=lambda args, key: {"charge": key},
    query=lambda key, args: Found(None),
)
APPROVED_WIRE = WIRE.model_copy(update={"requires_approval": True})


def factory(fleet: str = "fleet-a", *, hours_ago: float = 0.0) -> EventFactory:
    """An event factory whose clock is fixed that long ago (so cases have an age)."""
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    return EventFactory(fleet, "inbox-test", clock=lambda: at)


def escalated_wire(f: EventFactory, workflow_id: str, escalation_id: str) -> list[ev.Event]:
    """quote -> hold_room -> send_wire left in doubt and escalated by its policy."""
    quote = f.intent(workflow_id, "quote", QUOTE, {"city": "Lisbon"}, sequence=0)
    hold = f.intent(workflow_id, "hold", HOLD, {"nights": 2}, sequence=1)
    wire = f.intent(
        workflow_id, "wire", WIRE, {"amount": 1250, "card": CARD, "iban": "PT50"}, sequence=2
    )
    evidence = {"policy": "escalate", "note": "unkeyed and irreversible"}
    return [
        f.workflow_started(workflow_id, name="trip", attempt=1, read_only=False, max_attempts=3),
        quote,
        f.outcome(
            workflow_id, "quote", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"price": 420}
        ),
        hold,
        f.outcome(
            workflow_id, "hold", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"hold": "h-1"}
        ),
        wire,
        f.envelope(
            workflow_id,
            "wire",
            ev.StepAbandoned(
                reason="policy escalate: an in-doubt send_wire is never decided automatically",
                escalation_id=escalation_id,
                evidence_json=json.dumps(evidence),
                source=Source.RECOVERY,
            ),
        ),
    ]


def escalated_lookup(f: EventFactory, workflow_id: str, escalation_id: str) -> list[ev.Event]:
    """A keyed charge whose query hook kept failing: probes with errors, then escalated."""
    intent = f.intent(workflow_id, "charge", LOOKUP, {"amount": 99, "card": CARD}, sequence=0)
    probes = [
        f.envelope(
            workflow_id,
            "charge",
            ev.ResolutionAttempted(
                policy=ResolutionPolicy.QUERY, attempt=n, error=f"payments timed out ({n})"
            ),
        )
        for n in (1, 2, 3)
    ]
    abandoned = ev.StepAbandoned(
        reason="query attempts exhausted (3)", escalation_id=escalation_id, source=Source.RECOVERY
    )
    return [intent, *probes, f.envelope(workflow_id, "charge", abandoned)]


WIRE_ARGS = {"amount": 100, "to": "acct-A", "card": CARD}


#: The agents' redaction key: a wire that needs approval has a secret card (it is required).
REDACTION_KEY = RedactionKey("inbox-test-redaction-key")


def wire_call(workflow_id: str, arguments: dict[str, object]) -> tuple[str, str]:
    """The approved wire's arguments as the SDK shows them, and the call's fingerprint."""
    return APPROVED_WIRE.recorded_arguments(
        arguments, workflow_id=workflow_id, step_id="wire", key=REDACTION_KEY
    )


def approval_request(
    f: EventFactory,
    workflow_id: str,
    before: list[ev.Event],
    arguments: dict[str, object],
    *,
    request: int = 1,
    reason: str | None = "a wire cannot be recalled",
) -> ev.Event:
    """The request the SDK appends for a call of the pivot send_wire (see producer.approval)."""
    shown, digest = wire_call(workflow_id, arguments)
    body = ev.ApprovalRequested(
        tool=APPROVED_WIRE.name,
        reason=reason,
        arguments_json=shown,
        arguments_digest=digest,
        saga_json=saga_json(replay(workflow_id, before), "wire"),
        request=request,
    )
    return f.envelope(workflow_id, "wire", body, "request", request, digest)


def pending_approval(f: EventFactory, workflow_id: str) -> list[ev.Event]:
    """hold_room succeeded; the pivot send_wire (100 to acct-A) waits for an approval."""
    hold = f.intent(workflow_id, "hold", HOLD, {"nights": 1}, sequence=0)
    before = [
        f.workflow_started(workflow_id, name="trip", attempt=1, read_only=False, max_attempts=3),
        hold,
        f.outcome(workflow_id, "hold", attempt=1, status=OutcomeStatus.SUCCEEDED),
    ]
    return [*before, approval_request(f, workflow_id, before, WIRE_ARGS)]


def dead_lettered(f: EventFactory, workflow_id: str, escalation_id: str) -> list[ev.Event]:
    """A workflow past its resumption limit."""
    return [
        f.workflow_started(workflow_id, name="trip", attempt=1, read_only=False, max_attempts=1),
        f.envelope(
            workflow_id,
            None,
            ev.WorkflowDeadLettered(
                attempt=1, reason="too many resumes", escalation_id=escalation_id
            ),
        ),
    ]

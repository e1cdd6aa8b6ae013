"""Approval gates bound to one exact call (pure): what a request shows, what a decision binds.

A pivot step that requires approval asks for it with the call's arguments as its intent
will record them (secret values redacted), their digest and the saga's state.  A decision
records the digest it decided on; the fold applies it only to the request that showed that
digest, and the SDK runs the pivot only with a call of the approved digest, within the
tool's ``approval_valid_for``.  Any other call asks again: a new request (``request`` + 1)
voids the earlier ones, and an answer to a voided request is kept as an anomaly, never
applied.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from stepledger.domain import events as ev


class AuthMethod(StrEnum):
    """How the author of an answer (``by``) was authenticated."""

    USERS_FILE = "users_file"
    """The inbox checked the person's own token against its users file."""
    PROXY_HEADER = "proxy_header"
    """A reverse proxy the operator trusts named the person in a header."""
    INBOX_TOKEN = "inbox_token"
    """The shared inbox token: the name was typed, not proven."""
    OS_USER = "os_user"
    """The command line: the operating-system user that ran it."""
    DECLARED = "declared"
    """The command line with ``--by``: a name given, not proven."""


@dataclass(frozen=True)
class ApprovalGate:
    """A step's newest approval request and the decision on it, as the log tells them."""

    request: int
    """Which request this is (1, 2, ...); a newer one voids it."""
    digest: str | None
    """The digest of the call shown (None: a request written before calls were bound)."""
    arguments_json: str | None
    """The call's arguments as shown (secret values redacted)."""
    saga_json: str | None
    """The saga's state when it was asked."""
    valid_for_s: int
    """How long an approval stays valid once given (0: no expiry)."""
    requested_at: datetime
    decided_at: datetime | None = None
    granted: bool | None = None
    decided_digest: str | None = None
    """The digest the decision names (None: an answer that named none)."""
    decided_by: str = ""


def requested(body: ev.ApprovalRequested, at: datetime) -> ApprovalGate:
    """The gate a request opens."""
    return ApprovalGate(
        request=body.request,
        digest=body.arguments_digest,
        arguments_json=body.arguments_json,
        saga_json=body.saga_json,
        valid_for_s=body.valid_for_s,
        requested_at=at,
    )


def request_problem(
    gate: ApprovalGate | None, body: ev.ApprovalRequested
) -> tuple[str, str] | None:
    """Why a request of a step that already has a gate is not applied (None: it is)."""
    if gate is not None and body.request <= gate.request:
        return (
            "stale_approval_request",
            f"request {body.request} of a step already at request {gate.request}",
        )
    return None


def decision_problem(gate: ApprovalGate | None, body: ev.ApprovalDecided) -> tuple[str, str] | None:
    """Why a decision does not answer the pending request (None: it does)."""
    if gate is None:
        return None
    if body.request and body.request != gate.request:
        return (
            "stale_approval",
            f"answers request {body.request}, the step awaits request {gate.request}",
        )
    if gate.digest is None or body.arguments_digest is None:
        return None
    if body.arguments_digest != gate.digest:
        return (
            "stale_approval",
            f"decided on call {body.arguments_digest[:12]}, the step awaits approval of "
            f"{gate.digest[:12]} (request {gate.request})",
        )
    return None


def decided(gate: ApprovalGate | None, body: ev.ApprovalDecided, at: datetime) -> ApprovalGate:
    """The gate once a decision answered it."""
    base = gate or ApprovalGate(1, None, None, None, 0, at)
    return replace(
        base,
        decided_at=at,
        granted=body.granted,
        decided_digest=body.arguments_digest,
        decided_by=body.by,
    )


def why_ask_again(
    gate: ApprovalGate, digest: str, *, now: datetime, valid_for_s: float | None
) -> str | None:
    """Why a call of ``digest`` needs a new request, or None when this gate covers it.

    A pending request covers only the call it showed; a granted approval only the call it
    named, and (with ``valid_for_s``) only until that long after it was given.
    """
    if gate.granted is None:
        if gate.digest == digest:
            return None
        if gate.digest is None:
            return "the pending request names no call: asking again for this one"
        return f"the call differs from the one shown ({_short(gate.digest)}, now {_short(digest)})"
    if gate.decided_digest is None:
        return "the approval names no call: asking again for this one"
    if gate.decided_digest != digest:
        return (
            f"the call differs from the one approved ({_short(gate.decided_digest)}, "
            f"now {_short(digest)})"
        )
    expires = None if valid_for_s is None or gate.decided_at is None else gate.decided_at
    if expires is not None and now > expires + timedelta(seconds=float(valid_for_s or 0)):
        return f"the approval given at {expires.isoformat()} expired ({valid_for_s:g}s)"
    return None


def _short(digest: str) -> str:
    return digest[:12]

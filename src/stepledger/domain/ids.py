"""Deterministic ids: the same step always yields the same event ids and idempotency key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_SEP = "\x1f"


def digest(*parts: object) -> str:
    """Return the SHA-256 hex digest of the parts joined by a separator no id contains."""
    return hashlib.sha256(_SEP.join(str(p) for p in parts).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """Serialise to JSON with sorted keys and no spaces, so equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def loads_or_text(text: str | None) -> Any:
    """Parse recorded JSON for display; text that is not JSON is returned as it is."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def event_id(workflow_id: str, step_id: str | None, kind: str, *qualifiers: object) -> str:
    """Return the id of an event, derived from what the event is rather than drawn at random."""
    return digest(workflow_id, step_id or "", kind, *qualifiers)[:32]


def idempotency_key(workflow_id: str, step_id: str, tool: str, attempt: int = 1) -> str:
    """Return the key a tool call passes to its service; a re-drive of the same intent reuses it.

    A fresh intent after a definite failure (attempt > 1) gets a fresh key, because a
    service that remembers keys would otherwise replay the recorded failure.
    """
    base = "sl-" + digest(workflow_id, step_id, tool)[:40]
    return base if attempt == 1 else f"{base}-a{attempt}"


def compensation_key(step_idempotency_key: str) -> str:
    """Return the compensation's own key, derived from the step's key."""
    return "slc-" + digest(step_idempotency_key, "compensation")[:40]


def escalation_id(workflow_id: str, step_id: str | None, reason_kind: str, attempt: int) -> str:
    """Return the id of an escalation (short enough to type on the command line)."""
    return "esc-" + digest(workflow_id, step_id or "", reason_kind, attempt)[:16]


def canonical_digest(canonical: str) -> str:
    """Return the SHA-256 of arguments in canonical JSON (``Tool.arguments_digest`` uses it)."""
    return hashlib.sha256(canonical.encode()).hexdigest()

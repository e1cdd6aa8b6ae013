"""Deterministic ids: the same step always yields the same event ids and idempotency key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_SEP = "\x1f"


def digest(*parts: object) -> str:
    """Return the SHA-256 hex digest of the parts joined by a separator no id contains."""
    return hashlib.sha256(_SEP.join(map(str, parts)).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """Serialise to JSON with sorted keys and no spaces, so equal values give equal text."""
    return _CANONICAL.encode(value)


#: One encoder for every canonical text (``json.dumps`` with options builds one per call).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)


def typed_canonical_json(value: Any) -> str:
    """Canonical JSON in which a value that is not JSON keeps its type.

    ``canonical_json`` writes ``date(2026, 1, 1)`` as ``"2026-01-01"``, the same text as the
    string: a digest of it could not tell them apart.  Here every value that is not a JSON
    value is written as ``{"\u0000type": "module.Name", "value": str(value)}``; JSON values
    are written exactly as ``canonical_json`` writes them, so their digests do not change.
    """
    return json.dumps(
        _tagged(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )


_TYPE_TAG = "\u0000type"


def plain_json(value: Any) -> bool:
    """True when ``typed_canonical_json`` would tag nothing in the value (it is plain JSON).

    Exact types only (a ``str`` subclass answers False): a False answer costs the caller
    the typed pass, never a wrong text.
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is dict:
        return all(
            type(k) is str and (type(v) in _SCALARS or plain_json(v)) for k, v in value.items()
        )
    if kind is list:
        return all(type(v) in _SCALARS or plain_json(v) for v in value)
    return False


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _tagged(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _tagged(v) for k, v in value.items()}
    kind = type(value)
    inner = [_tagged(v) for v in value] if isinstance(value, tuple | set | frozenset) else None
    if isinstance(value, set | frozenset):
        inner = sorted(inner or [], key=lambda v: json.dumps(v, sort_keys=True, default=str))
    shown = inner if inner is not None else str(value)
    return {_TYPE_TAG: f"{kind.__module__}.{kind.__qualname__}", "value": shown}


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

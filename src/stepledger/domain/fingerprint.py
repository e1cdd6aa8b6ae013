"""One fingerprint of a call: what its step identity, its plan check and its approval bind to.

The canonical description of a call is its tool, its step and the arguments that identify
it (a tool's ``identity_args``; every argument by default), each secret value as its keyed
mark, never the value (:mod:`stepledger.domain.secrets`).  Its SHA-256 is the call's
fingerprint, recorded as the intent's and the approval request's ``arguments_digest``:

- a resumed call is the recorded step when its fingerprint is the recorded one (another
  amount, another card: a :class:`~stepledger.errors.PlanMismatchError`);
- an approval names the fingerprint it approved, so it covers every attempt of that call
  (a retry after a definite failure runs under a new idempotency key, same fingerprint)
  and no other call (another card has another mark, with a redaction key);
- the digest of a model request is the same canonical digest (:func:`of_value`).

Without a redaction key secret values take no part (the fixed marker stands in for each),
so a tool that requires approval and has secret arguments needs one
(:func:`ensure_bindable`).  Intents written before fingerprints recorded the digest of
every argument with secrets as the fixed marker (:func:`legacy`): a call is matched
against either, so a workflow in flight across an upgrade resumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepledger.domain import secrets
from stepledger.domain.ids import canonical_digest, canonical_json, digest, plain_json
from stepledger.domain.ids import typed_canonical_json as _typed
from stepledger.errors import ToolDefinitionError


def of_value(value: Any) -> str:
    """The canonical digest of a value (typed canonical JSON: a date is not its string)."""
    return canonical_digest(_typed(value))


def of_text(tool: str, step_id: str, arguments_text: str) -> str:
    """The fingerprint of a call whose identifying arguments have this canonical text."""
    return digest("stepledger.call", tool, step_id, arguments_text)


def recorded(
    tool: str,
    arguments: Mapping[str, Any],
    *,
    secret_args: frozenset[str],
    identity_args: frozenset[str] | None,
    workflow_id: str,
    step_id: str,
    key: secrets.RedactionKey | None,
) -> tuple[str, str]:
    """A call's ``arguments_json`` (secrets marked) and its fingerprint, in one pass where it can.

    Recorded arguments and the description share their marks, so when every argument
    identifies the call and the arguments are plain JSON, the description's text is the
    recorded text.
    """
    shown = redacted(arguments, secret_args, workflow_id, step_id, key)
    text = canonical_json(shown)
    if identity_args is None and plain_json(shown):
        return text, of_text(tool, step_id, text)
    identifying = _identifying(shown, identity_args)
    return text, of_text(tool, step_id, _typed(identifying))


def redacted(
    arguments: Mapping[str, Any],
    secret_args: frozenset[str],
    workflow_id: str,
    step_id: str,
    key: secrets.RedactionKey | None,
) -> dict[str, Any]:
    """The arguments with each secret value as its mark (keyed, salted by workflow and step)."""
    if not secret_args:
        return dict(arguments)
    mark = secrets.fixed_mark if key is None else secrets.keyed_mark(key, workflow_id, step_id)
    return secrets.redact(arguments, secret_args, mark)


def legacy(arguments: Mapping[str, Any], secret_args: frozenset[str]) -> str:
    """The digest intents recorded before fingerprints: every argument, secrets fixed-marked."""
    if secret_args:
        arguments = secrets.redact(arguments, secret_args, secrets.fixed_mark)
    return canonical_digest(_typed(arguments))


def ensure_bindable(
    tool: str,
    secret_args: frozenset[str],
    requires_approval: bool,
    key: secrets.RedactionKey | None,
) -> None:
    """Raise ToolDefinitionError when an approval of the tool could not bind its secrets."""
    if key is None and requires_approval and secret_args:
        paths = ", ".join(sorted(map(repr, secret_args)))
        raise ToolDefinitionError(
            f"tool {tool!r} requires approval and has secret_args ({paths}): an approval "
            "binds secret values only as keyed HMACs, so set a redaction key "
            "(STEPLEDGER_REDACTION_KEY or redaction_key in the config file)",
            tool=tool,
        )


def _identifying(shown: Mapping[str, Any], identity_args: frozenset[str] | None) -> Any:
    if identity_args is None:
        return shown
    return {k: v for k, v in shown.items() if k in identity_args}

"""What an approval request shows (pure): the exact call, redacted, and the saga around it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stepledger.domain.ids import loads_or_text
from stepledger.domain.state import StepState

#: Re-redacts recorded arguments with the tool's declared secrets (a registry was given).
Redactor = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ShownCall:
    """What an approval request shows: the exact call, redacted, and the saga around it."""

    request: int
    """Which request of the step this is (a newer one voids the earlier ones)."""
    digest: str
    """The digest of the call's arguments: what an approval binds (empty: bound to nothing)."""
    arguments: Any
    """The arguments as the intent will record them (secret values redacted)."""
    saga: Any
    """What already happened, what a denial would undo and what it leaves standing."""
    valid_for_s: int
    """How long an approval stays valid once given (0: no expiry)."""
    requested_at: datetime | None


def shown_call(step: StepState | None, redactor: Redactor | None) -> ShownCall | None:
    """What the step's newest approval request shows, or None when it never asked."""
    gate = None if step is None else step.approval
    if step is None or gate is None:
        return None
    arguments = loads_or_text(gate.arguments_json)
    if redactor is not None and isinstance(arguments, dict) and step.tool:
        arguments = redactor(step.tool, arguments)
    return ShownCall(
        request=gate.request,
        digest=gate.digest or "",
        arguments=arguments,
        saga=loads_or_text(gate.saga_json),
        valid_for_s=gate.valid_for_s,
        requested_at=gate.requested_at,
    )

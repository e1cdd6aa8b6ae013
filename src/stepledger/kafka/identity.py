"""How a refusal names this client: its fleet role and SASL user, from its settings."""

from __future__ import annotations

from stepledger.config import Settings
from stepledger.errors import NotAuthorisedError


def who(settings: Settings) -> str:
    """How a refusal names this client: its fleet role, else its SASL user."""
    user = settings.kafka.get("sasl.username")
    if settings.role is not None:
        return f"{settings.fleet_id} {settings.role} (User:{user})" if user else settings.role
    return f"User:{user}" if user else "this client"


def refused_login(settings: Settings) -> NotAuthorisedError:
    """The one line of a login the broker refused: the principal, and what to check."""
    role = who(settings)
    message = f"not authorised: {role} was refused its login (wrong password or unknown user)"
    return NotAuthorisedError(message, role=role, acl="", resource="login")

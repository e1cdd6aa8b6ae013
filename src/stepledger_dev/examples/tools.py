"""Tool definitions, with recovery hooks, for the example services.

- ``payments.charge``: keyed (a repeat is safe) and undoable (a refund, its own transaction
  under its own key, derived from the charge's); policy query (look the charge up by key).
  It declares an explicit re-drive, so a query that finds nothing re-drives the charge under
  the same key instead of reporting not_happened: the service de-duplicates by key.
- ``bookings.book``: compensatable and keyed; policy compensate (cancel by the booking's
  key; an unknown booking is "nothing to undo").
- ``payments.capture``: the same charge with no refund (keyed, cannot be undone): the pivot
  of pay-then-notify (``stepledger_dev.examples.pay_notify_agent``); policy query.
- ``email.send``: neither (no key, no undo): the trip's pivot; policy escalate (a human
  decides); its ``correction`` names what a human can do instead (a correction email).

Load it in the daemon with ``--tools stepledger_dev.examples.tools:registry``; the service URLs
come from ``STEPLEDGER_PAYMENTS_URL``, ``STEPLEDGER_BOOKINGS_URL`` and
``STEPLEDGER_EMAIL_URL`` (a tool whose URL is unset is left out), the limits from
``STEPLEDGER_TOOL_TIMEOUT_S`` and ``STEPLEDGER_TOOL_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stepledger.domain.enums import ResolutionPolicy
from stepledger.domain.ids import compensation_key
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import ToolRegistryError, ToolServiceError
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.clients import (
    BookingsClient,
    EmailClient,
    JsonObject,
    PaymentsClient,
    ServiceError,
)

PAYMENTS = "payments.charge"
CAPTURE = "payments.capture"
BOOKINGS = "bookings.book"
EMAIL = "email.send"
ENV_URLS = {
    PAYMENTS: "STEPLEDGER_PAYMENTS_URL",
    BOOKINGS: "STEPLEDGER_BOOKINGS_URL",
    EMAIL: "STEPLEDGER_EMAIL_URL",
}
DEFAULT_TIMEOUT_S = 5.0
#: Test-only: ``redrive-ignores-key`` loads a deliberately broken payments tool (chaos harness).
BREAK_ENV = "STEPLEDGER_EXAMPLE_BREAK"
#: HTTP calls give up a little before the tool's timeout, so a hook answers in time.
_CLIENT_SHARE = 0.8

T = TypeVar("T")


def service_call(tool: str, call: Callable[[], T]) -> T:
    """Run one service call, turning its HTTP and transport errors into ToolServiceError."""
    try:
        return call()
    except ServiceError as exc:
        retryable = exc.status >= 500 or exc.status == 429
        raise ToolServiceError(
            f"{tool}: service answered HTTP {exc.status}: {exc.body}",
            status=exc.status,
            tool=tool,
            retryable=retryable,
            # A 5xx can come after the service did the work: the effect is unknown.
            effect_unknown=exc.status >= 500,
        ) from exc
    except OSError as exc:
        # The request may or may not have reached the service: the effect is unknown.
        raise ToolServiceError(
            f"{tool}: service unreachable: {exc}",
            tool=tool,
            retryable=True,
            effect_unknown=not isinstance(exc, ConnectionRefusedError),
        ) from exc


def payments_tool(
    url: str,
    *,
    fault: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    broken_redrive: bool = False,
    refund: bool = True,
    **kw: Any,
) -> Tool:
    """The keyed, queryable charge tool: args ``amount``, ``currency``, ``customer`` (``memo``).

    The first three identify the charge; a ``memo`` is free text the service ignores, so a
    resumed agent that words it differently is making the same charge (``identity_args``).

    ``refund=False`` gives ``payments.capture``: the same charge, which cannot be undone.

    ``broken_redrive`` is a test-only switch for the chaos harness: a deliberately broken
    build whose re-drive ignores the idempotency key (and whose policy re-drives without
    asking), so a crash after the charge leads to a second charge the harness must catch.
    """
    client = PaymentsClient(url, timeout=timeout_s * _CLIENT_SHARE)

    def run(args: dict[str, Any], key: str) -> JsonObject:
        return service_call(
            PAYMENTS,
            lambda: client.charge(
                key, int(args["amount"]), str(args["currency"]), str(args["customer"]), fault=fault
            ),
        )

    def redrive(args: dict[str, Any], key: str) -> JsonObject:
        # No fault injection: the re-drive is recovery's call, not the agent's.
        used = f"{key}-broken-{uuid.uuid4().hex[:8]}" if broken_redrive else key
        return service_call(
            PAYMENTS,
            lambda: client.charge(
                used, int(args["amount"]), str(args["currency"]), str(args["customer"])
            ),
        )

    def query(args: dict[str, Any], key: str) -> Found | NotFound:
        charge = service_call(PAYMENTS, lambda: client.find_charge(key))
        return NotFound(f"no charge under {key}") if charge is None else Found(charge)

    def undo(args: dict[str, Any], key: str, known_result: Any) -> JsonObject | NotFound:
        # The refund is its own transaction under its own key (derived from the charge's),
        # so a repeated undo refunds once; an unknown charge is "nothing to undo".
        answer = service_call(PAYMENTS, lambda: client.refund(compensation_key(key), key))
        if answer.get("status") == "nothing_to_undo":
            return NotFound(f"no charge under {key}: nothing to undo")
        return answer

    return Tool(
        name=PAYMENTS if refund else CAPTURE,
        keyed=True,
        identity_args=frozenset({"amount", "currency", "customer"}),
        policy=ResolutionPolicy.REDRIVE if broken_redrive else ResolutionPolicy.QUERY,
        timeout_s=timeout_s,
        run=run,
        redrive=redrive,
        query=query,
        compensate=undo if refund else None,
        **kw,
    )


def bookings_tool(
    url: str, *, fault: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, **kw: Any
) -> Tool:
    """The keyed, compensatable booking tool: args ``hotel``, ``nights``."""
    client = BookingsClient(url, timeout=timeout_s * _CLIENT_SHARE)

    def run(args: dict[str, Any], key: str) -> JsonObject:
        return service_call(
            BOOKINGS,
            lambda: client.book(key, str(args["hotel"]), int(args["nights"]), fault=fault),
        )

    def query(args: dict[str, Any], key: str) -> Found | NotFound:
        booking = service_call(BOOKINGS, lambda: client.find_booking(key))
        return NotFound(f"no booking under {key}") if booking is None else Found(booking)

    def compensate(args: dict[str, Any], key: str, known_result: Any) -> JsonObject | NotFound:
        answer = service_call(BOOKINGS, lambda: client.cancel(key))
        if answer.get("status") == "nothing_to_undo":
            return NotFound(f"no booking under {key}: nothing to undo")
        return answer

    return Tool(
        name=BOOKINGS,
        policy=ResolutionPolicy.COMPENSATE,
        keyed=True,
        timeout_s=timeout_s,
        run=run,
        query=query,
        compensate=compensate,
        **kw,
    )


def email_tool(
    url: str, *, fault: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, **kw: Any
) -> Tool:
    """The irreversible email tool (no key): args ``to``, ``subject``, ``body``.

    The recipient and the subject identify the email; a body worded otherwise on a resume
    is the same email (``identity_args``), never a second one.
    """
    client = EmailClient(url, timeout=timeout_s * _CLIENT_SHARE)

    def run(args: dict[str, Any], key: str) -> JsonObject:
        return service_call(
            EMAIL,
            lambda: client.send(
                str(args["to"]),
                str(args.get("subject", "")),
                str(args.get("body", "")),
                fault=fault,
            ),
        )

    return Tool(
        name=EMAIL,
        identity_args=frozenset({"to", "subject"}),
        policy=ResolutionPolicy.ESCALATE,
        correction="send the recipient a correction email: the trip was cancelled and refunded",
        timeout_s=timeout_s,
        run=run,
        **kw,
    )


def make_registry(
    payments_url: str | None = None,
    bookings_url: str | None = None,
    email_url: str | None = None,
    fault: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_attempts: int = 3,
    broken_redrive: bool = False,
) -> ToolRegistry:
    """The example tools for the services at these URLs (``fault`` goes on every agent call)."""
    limits: dict[str, Any] = {"fault": fault, "timeout_s": timeout_s, "max_attempts": max_attempts}
    tools = ToolRegistry()
    if payments_url:
        tools.register(payments_tool(payments_url, broken_redrive=broken_redrive, **limits))
        tools.register(payments_tool(payments_url, refund=False, **limits))
    if bookings_url:
        tools.register(bookings_tool(bookings_url, **limits))
    if email_url:
        tools.register(email_tool(email_url, **limits))
    return tools


def registry(env: Mapping[str, str] | None = None) -> ToolRegistry:
    """The example tools for the services named by ``STEPLEDGER_*_URL`` environment variables."""
    env = os.environ if env is None else env
    urls = {name: env.get(var) for name, var in ENV_URLS.items()}
    if not any(urls.values()):
        names = ", ".join(ENV_URLS.values())
        raise ToolRegistryError(f"set at least one of {names} to load the example tools")
    try:
        timeout_s = float(env.get("STEPLEDGER_TOOL_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        max_attempts = int(env.get("STEPLEDGER_TOOL_MAX_ATTEMPTS", 3))
    except ValueError as exc:
        raise ToolRegistryError(f"invalid example tool limit: {exc}") from None
    return make_registry(
        urls[PAYMENTS],
        urls[BOOKINGS],
        urls[EMAIL],
        timeout_s=timeout_s,
        max_attempts=max_attempts,
        broken_redrive=env.get(BREAK_ENV) == "redrive-ignores-key",
    )

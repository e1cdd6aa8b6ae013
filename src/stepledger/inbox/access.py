"""The one place an inbox endpoint asks whether this person may do this to this fleet's case.

Endpoints that act need a role (:func:`requires`, a decorator); endpoints that touch a case
ask :func:`refused` with the case's fleet, as the log tells it (a workflow's fleet is its
first event's and never changes), before they render or append anything.  Either way a
refusal is a 403 with one line, and nothing is written.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from stepledger.inbox.auth import CSRF_FIELD, check_csrf, identity_of
from stepledger.inbox.roles import Action

Endpoint = TypeVar("Endpoint", bound=Callable[..., Awaitable[Response]])


def forbidden(reason: str) -> Response:
    """The 403 every refusal of the inbox's roles and fleets answers with (one line)."""
    return PlainTextResponse(f"403: {reason}", status_code=403)


def refused(request: Request, action: Action, fleet: str | None = None) -> Response | None:
    """A 403 when the request's person may not take ``action`` on ``fleet``'s case, else None."""
    who = identity_of(request)
    reason = who.grant.refusal(action, fleet)
    if reason is None:
        return None
    return forbidden(f"{who.name or 'the shared inbox token'}: {reason}")


def requires(action: Action) -> Callable[[Endpoint], Endpoint]:
    """Refuse an endpoint (function or method; the request is its last argument) to a role
    that may not take ``action``: 403 before the endpoint runs."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def guarded(*args: Any) -> Response:
            request = args[-1]
            assert isinstance(request, Request)
            refusal = refused(request, action)
            return refusal if refusal is not None else await endpoint(*args)

        return guarded  # type: ignore[return-value]

    return decorate


async def operator_form(request: Request, csrf_secret: str) -> FormData | Response:
    """The posted form of an operator's command, or the refusal: the role is checked before
    anything is read, then the form's CSRF token (a 403 in one line either way)."""
    role = refused(request, Action.CONTROL)
    if role is not None:
        return role
    form = await request.form()
    refusal = check_csrf(request, form.get(CSRF_FIELD), csrf_secret)
    if refusal is not None:
        return PlainTextResponse(f"403: {refusal}", status_code=403)
    return form

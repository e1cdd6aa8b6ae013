"""The inbox's gate: a token on every request, a CSRF token on every form, strict headers.

The token is handed to a person once, in the URL ``stepledger inbox`` prints
(``/?token=...``).  That first request trades it for an HttpOnly, SameSite=Strict cookie
and is redirected to the same page without the token, so it does not stay in the address
bar or the history.  Programs may send ``Authorization: Bearer <token>`` instead.  Every
other request is refused with 401.  Forms carry a CSRF token derived from the inbox
token (a page that cannot read ours cannot forge it) and a cross-origin ``Origin`` is
refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIN_TOKEN = 16
TOKEN_PARAM = "token"
CSRF_FIELD = "csrf"
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # not no-referrer: a browser then sends "Origin: null" with our own forms.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def new_token() -> str:
    """A fresh random token (what ``stepledger inbox`` prints when none is configured)."""
    return secrets.token_urlsafe(24)


def csrf_token(token: str) -> str:
    """The CSRF token forms carry: derived from the inbox token, useless without it."""
    return hmac.new(token.encode(), b"stepledger-inbox-csrf", hashlib.sha256).hexdigest()


def check_csrf(request: Request, form_value: object, token: str) -> str | None:
    """Why a form post is refused (None when its CSRF token and origin are right)."""
    if not isinstance(form_value, str) or not hmac.compare_digest(form_value, csrf_token(token)):
        return "CSRF token missing or wrong: reload the page and answer again"
    origin = request.headers.get("origin")
    if origin is not None and origin != _own_origin(request):
        return f"cross-origin form post from {origin} refused"
    return None


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


class TokenGate:
    """ASGI middleware: only requests that carry the inbox token get through."""

    def __init__(self, app: ASGIApp, *, token: str, cookie: str) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let the request through, trade a URL token for a cookie, or refuse it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        response: Response | None = None
        if self._valid(query.get(TOKEN_PARAM)) and scope["method"] in ("GET", "HEAD"):
            response = self._trade(scope, query)
        elif not (self._valid(_bearer(headers)) or self._valid(_cookie(headers, self.cookie))):
            response = PlainTextResponse(
                "401: this inbox needs its token: open the URL `stepledger inbox` printed",
                status_code=401,
            )
        if response is not None:
            await _secured(response)(scope, receive, send)
            return
        await self.app(scope, receive, _with_headers(send))

    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def _trade(self, scope: Scope, query: dict[str, str]) -> Response:
        rest = {k: v for k, v in query.items() if k != TOKEN_PARAM}
        target = (
            scope.get("root_path", "") + scope["path"] + ("?" + urlencode(rest) if rest else "")
        )
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
        return response


def _bearer(headers: Headers) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else None


def _cookie(headers: Headers, name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no token
        return None
    morsel = jar.get(name)
    return None if morsel is None else morsel.value


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers: list[Any] = list(message.get("headers", []))
            present = {bytes(k).lower() for k, _ in headers}
            for key, value in SECURITY_HEADERS.items():
                if key.encode() not in present:
                    headers.append((key.encode(), value.encode()))
            message = {**message, "headers": headers}
        await send(message)

    return sending

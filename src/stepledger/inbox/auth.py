"""The inbox's gate: who may open it, what the browser keeps, and who an answer is from.

**What opens the inbox.** A credential: the inbox token (one shared secret, handed out in
the URL ``stepledger inbox`` prints), or a person's own token from the users file (names
with SHA-256 hashes of their tokens, :func:`load_users`).  Programs send it as
``Authorization: Bearer <token>`` on every request.

**What the browser keeps.** The first visit (``/?token=...``) trades the credential for a
session: a random id (256 bits) known only to this process, kept server-side with the
identity it proves and an expiry (:class:`Sessions`), revocable (``POST /logout``, or a
restart, which forgets every session).  The browser gets that id in an HttpOnly,
SameSite=Strict cookie whose ``Path`` is this inbox's own random prefix (``/s/<random>/``),
and is redirected there, so the token does not stay in the address bar or the history.
Browsers do not isolate cookies by port: a cookie with ``Path=/`` reaches every server on
127.0.0.1.  Scoped to a path no other server knows, the session id is sent to this inbox
only; and it is not the token: it expires, dies with the process and opens nothing else.

**Who answers, for which fleets.** With a users file, the name an answer records is the
one the token proved (``users_file``), and the person's line says which fleets they act
for and in which role (:mod:`~stepledger.inbox.users`; the gate narrows it to the fleets
this inbox serves); behind a reverse proxy the operator trusts, the name is the one
the proxy puts in the configured header, accepted only on requests that also carry the
inbox token (``proxy_header``), so a local process that reaches the port directly cannot
pick a name.  With the shared token alone the name is typed, and recorded as such
(``inbox_token``).

Forms carry a CSRF token derived from a per-process secret, and a cross-origin ``Origin``
is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stepledger.domain.approvals import AuthMethod
from stepledger.errors import ConfigError
from stepledger.inbox.roles import EVERY_FLEET, Grant
from stepledger.inbox.users import HASH_PREFIX, User

MIN_TOKEN = 16
TOKEN_PARAM = "token"
CSRF_FIELD = "csrf"
IDENTITY_KEY = "stepledger.identity"
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 10_000
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
_REFUSED = "401: this inbox needs its token: open the URL `stepledger inbox` printed"


def new_token() -> str:
    """A fresh random token (what ``stepledger inbox`` prints when none is configured)."""
    return secrets.token_urlsafe(24)


def hash_token(token: str) -> str:
    """How a users file stores a person's token (tokens are random: a plain SHA-256 will do)."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def csrf_token(secret: str) -> str:
    """The CSRF token forms carry: derived from a secret the page's server holds."""
    return hmac.new(secret.encode(), b"stepledger-inbox-csrf", hashlib.sha256).hexdigest()


def check_csrf(request: Request, form_value: object, secret: str) -> str | None:
    """Why a form post is refused (None when its CSRF token and origin are right)."""
    if not isinstance(form_value, str) or not hmac.compare_digest(form_value, csrf_token(secret)):
        return "CSRF token missing or wrong: reload the page and answer again"
    origin = request.headers.get("origin")
    if origin is not None and origin != _own_origin(request):
        return f"cross-origin form post from {origin} refused"
    return None


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


@dataclass(frozen=True)
class Identity:
    """Who a request is from, and how that was established."""

    name: str
    """The authenticated name ('' when only the shared token was shown)."""
    auth: AuthMethod
    grant: Grant = EVERY_FLEET
    """The fleets this person acts for and their role."""

    @property
    def proven(self) -> bool:
        """True when the name was established by the inbox, not typed by the person."""
        return self.auth in (AuthMethod.USERS_FILE, AuthMethod.PROXY_HEADER)


SHARED = Identity("", AuthMethod.INBOX_TOKEN)


def identity_of(request: Request) -> Identity:
    """The identity the gate established for a request (the shared token's by default)."""
    found = request.scope.get(IDENTITY_KEY)
    return found if isinstance(found, Identity) else SHARED


class Credentials:
    """What opens the inbox: the shared token and/or the users' own tokens."""

    def __init__(self, token: str | None, users: Mapping[str, User] | None = None) -> None:
        self.token = token or None
        self.users = dict(users or {})
        if self.token is None and not any(u.hashed for u in self.users.values()):
            # Proxy-only lines ("-") open nothing by themselves: the proxy sends the token.
            raise ConfigError("the inbox needs a token or a users file with people's tokens")

    def check(self, given: str | None) -> Identity | None:
        """The identity a presented token proves, or None."""
        if not given or len(given) > 512:
            return None
        found: Identity | None = None
        hashed = hash_token(given)
        for name, user in self.users.items():  # every entry compared: no early exit
            if user.hashed is not None and hmac.compare_digest(hashed, user.hashed):
                found = Identity(name, AuthMethod.USERS_FILE, user.grant)
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            found = found or SHARED
        return found


@dataclass
class _Session:
    identity: Identity
    expires: float


class Sessions:
    """Server-side browser sessions: random ids, each with its identity and an expiry."""

    def __init__(
        self,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        limit: int = MAX_SESSIONS,
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.limit = limit
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def open(self, identity: Identity) -> str:
        """A new session for ``identity``; its id is what the browser keeps."""
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[sid] = _Session(identity, self.clock() + self.ttl_s)
            while len(self._sessions) > self.limit:
                self._sessions.popitem(last=False)  # the oldest goes first
        return sid

    def get(self, sid: str | None) -> Identity | None:
        """The identity of a live session, or None (unknown, revoked or expired)."""
        if not sid:
            return None
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            if self.clock() >= session.expires:
                del self._sessions[sid]
                return None
            return session.identity

    def revoke(self, sid: str | None) -> bool:
        """End a session; True if it was live."""
        with self._lock:
            return self._sessions.pop(sid or "", None) is not None


@dataclass(frozen=True)
class GateConfig:
    """How the gate admits requests."""

    credentials: Credentials
    sessions: Sessions
    cookie: str
    """The session cookie's name (it names the port, so two inboxes on one host do not clash)."""
    prefix: str
    """The random path every browser page lives under; the cookie is scoped to it."""
    proxy_header: str | None = None
    """A header naming the user, set by a reverse proxy the operator trusts."""
    serves: frozenset[str] | None = None
    """The fleets this inbox serves (its config pins one); None: every fleet its log holds.
    Every identity's grant is narrowed to them, so a record claiming another fleet in this
    fleet's log is nobody's case here."""


class TokenGate:
    """ASGI middleware: only requests with a credential or a live session get through."""

    def __init__(self, app: ASGIApp, *, config: GateConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let the request through with its identity, trade a URL token, or refuse it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.config
        headers = Headers(scope=scope)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        path: str = scope["path"]
        response: Response | None = None
        if TOKEN_PARAM in query and scope["method"] in ("GET", "HEAD"):
            response = self._trade(scope, query)
        elif path == config.prefix:
            response = RedirectResponse(config.prefix + "/", status_code=303)
        else:
            identity, problem = self._identify(headers, path)
            if identity is None:
                response = PlainTextResponse(problem, status_code=401)
            else:
                under = path.startswith(config.prefix + "/")
                grant = identity.grant.within(config.serves)
                scope = {
                    **scope,
                    IDENTITY_KEY: replace(identity, grant=grant),
                    "root_path": config.prefix if under else "",
                }
        if response is not None:
            await _secured(response)(scope, receive, send)
            return
        await self.app(scope, receive, _with_headers(send))

    def _identify(self, headers: Headers, path: str) -> tuple[Identity | None, str]:
        config = self.config
        bearer = config.credentials.check(_bearer(headers))
        if config.proxy_header is not None:
            # Behind the proxy every request carries the inbox token and the user's name.
            name = headers.get(config.proxy_header, "").strip()
            if bearer != SHARED or not name:
                return (
                    None,
                    f"401: this inbox is served through a proxy that names its user "
                    f"({config.proxy_header}) and carries the inbox token",
                )
            if len(name) > 120 or not name.isprintable():
                return None, "401: the proxy's user name is not 1-120 printable characters"
            return self._proxied(name)
        if bearer is not None:
            return bearer, ""
        if path.startswith(config.prefix + "/"):
            session = config.sessions.get(_cookie(headers, config.cookie))
            if session is not None:
                return session, ""
            return None, _REFUSED + " (no live session: it expired, was closed, or never was)"
        return None, _REFUSED

    def _proxied(self, name: str) -> tuple[Identity | None, str]:
        users = self.config.credentials.users
        if not users:  # no users file: every name the proxy gives, as before fleets
            return Identity(name, AuthMethod.PROXY_HEADER), ""
        user = users.get(name)
        if user is None:
            return None, "401: the proxy names a user the inbox's users file does not list"
        return Identity(name, AuthMethod.PROXY_HEADER, user.grant), ""

    def _trade(self, scope: Scope, query: dict[str, str]) -> Response:
        config = self.config
        identity = config.credentials.check(query.get(TOKEN_PARAM))
        if identity is None:
            return PlainTextResponse(_REFUSED, status_code=401)
        rest = {k: v for k, v in query.items() if k != TOKEN_PARAM}
        path: str = scope["path"]
        if not path.startswith(config.prefix + "/"):
            path = config.prefix + path
        target = path + ("?" + urlencode(rest) if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            config.cookie,
            config.sessions.open(identity),
            max_age=int(config.sessions.ttl_s),
            httponly=True,
            samesite="strict",
            path=config.prefix + "/",
        )
        return response


def session_id(request: Request, cookie: str) -> str | None:
    """The session id a request carries."""
    return _cookie(request.headers, cookie)


def _bearer(headers: Headers) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else None


def _cookie(headers: Headers, name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no session
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

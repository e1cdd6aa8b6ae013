"""Serving the inbox: the answerer wired to Kafka and the projection, uvicorn on loopback."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepledger.config import Settings
from stepledger.daemon.health import Health, serve_probes
from stepledger.domain.factory import EventFactory
from stepledger.errors import ConfigError, StepLedgerError
from stepledger.history.kafka import KafkaHistory
from stepledger.humanqueue.answers import Answerer
from stepledger.humanqueue.shown import Redactor
from stepledger.inbox.auth import MIN_TOKEN, SESSION_TTL_S, new_token
from stepledger.inbox.users import load_users
from stepledger.kafka.topics import check_retention
from stepledger.log import KafkaEventLog
from stepledger.readers.lake import LakeSource
from stepledger.resolution.registry import ToolRegistry

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_ENV = "STEPLEDGER_INBOX_TOKEN"


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the inbox listens."""

    db_path: Path
    """The projector's DuckDB file (its snapshot is read)."""
    lake: LakeSource | None = None
    """The lake the projectors commit to, read instead of ``db_path`` when given."""
    host: str = DEFAULT_HOST
    """The address to bind; loopback unless you mean to expose it."""
    port: int = DEFAULT_PORT
    """The port (0 picks a free one)."""
    token: str | None = None
    """The shared token; None generates one (unless a users file is given)."""
    tools: ToolRegistry | None = None
    """When given, arguments are re-redacted with each tool's declared secrets, and a restart
    from a step compensates first with them."""
    users: Path | None = None
    """A users file (``NAME sha256:HEX`` lines): each person opens the inbox with their token."""
    proxy_header: str | None = None
    """A header naming the user, set by a reverse proxy the operator trusts."""
    session_ttl_s: float = SESSION_TTL_S
    """How long a browser session lives."""
    metrics_port: int | None = None
    """Where /healthz and /readyz are served (ready: the queue can be read); None: nowhere."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names browsers may reach the inbox by beyond loopback and ``host`` (a Service's
    or an ingress's name); any other Host header gets 400 (a DNS-rebinding page)."""


def answerer_for(settings: Settings, options: ServeOptions) -> Answerer:
    """An answerer that appends to the settings' topic and reads through the snapshot."""
    factory = EventFactory(settings.fleet_id, settings.producer_id)
    reader = KafkaHistory(settings, snapshot=options.lake or options.db_path)
    return Answerer(KafkaEventLog(settings), factory, reader, redactor_for(options.tools))


def redactor_for(tools: ToolRegistry | None) -> Redactor | None:
    """Re-redact recorded arguments with the registry's declared secrets (belt and braces)."""
    if tools is None:
        return None
    registry = tools

    def redact(tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = registry.get(tool_name)
        return arguments if tool is None else tool.redact(arguments)

    return redact


def check_token(token: str | None, *, users: bool = False) -> str | None:
    """The configured token, or a fresh one (none with a users file); a short one is refused."""
    if token is None or token == "":
        return None if users else new_token()
    if len(token) < MIN_TOKEN:
        raise ConfigError(f"the inbox token must be at least {MIN_TOKEN} characters")
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), bound before the URL is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    settings: Settings, options: ServeOptions, announce: Callable[[str], None] = print
) -> None:
    """Serve the inbox until SIGINT/SIGTERM; ``announce`` receives the URL to open."""
    import uvicorn

    from stepledger.inbox.app import InboxConfig, create_app, warm

    users = {} if options.users is None else load_users(options.users)
    token = check_token(options.token, users=bool(users))
    if options.proxy_header is not None and token is None:
        raise ConfigError("behind a proxy the inbox needs its token (the proxy sends it)")
    sock = bind(options.host, options.port)
    # Starting until the queue is read: bound now, so a busy port fails before anything else.
    health = Health("the inbox")
    try:
        probes = serve_probes(options.metrics_port, health)
    except ConfigError:
        sock.close()
        raise
    port = int(sock.getsockname()[1])
    hosts = (
        "127.0.0.1",
        "localhost",
        "[::1]",
        options.host,
        f"[{options.host}]",
        *options.allowed_hosts,
    )
    config = InboxConfig(
        db_path=options.db_path,
        lake=options.lake,
        token=token,
        users=users,
        proxy_header=options.proxy_header,
        # A fleet's config (`fleet create`) pins its fleet: the broker lets this inbox read
        # and answer that fleet's log only, and a record claiming another fleet there is
        # nobody's case.
        serves=None if settings.role is None else frozenset({settings.fleet_id}),
        session_ttl_s=options.session_ttl_s,
        port=port,
        allowed_hosts=hosts,
    )
    answerer = answerer_for(settings, options)
    check_retention(settings, "inbox")
    app = create_app(config, answerer, options.tools)
    warm(app)
    shown = f"[{options.host}]" if ":" in options.host else options.host
    if not is_loopback(options.host):
        logger.warning(
            "the inbox listens on %s, not loopback: anyone who can reach it and "
            "holds the token can answer cases",
            options.host,
        )
    health.check = _readable(app)
    announce(f"http://{shown}:{port}/?token={token or 'YOUR_TOKEN'}")
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", server_header=False
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if probes is not None:
            probes.shutdown()
        app.state.pages.source.close()
        answerer.log.close()


def _readable(app: Any) -> Callable[[], str | None]:
    """The inbox's readiness: a page of its queue can be read (the projector's snapshot)."""
    from stepledger.humanqueue.queue import QueueFilter

    def check() -> str | None:
        try:
            app.state.pages.source.page(QueueFilter())
        except StepLedgerError as exc:
            return f"the inbox cannot read its queue: {exc.message}"
        return None

    return check

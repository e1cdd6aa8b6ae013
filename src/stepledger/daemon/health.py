"""Probes beside the metrics: ``/healthz`` (alive) and ``/readyz`` (ready) on a daemon's port.

Every daemon (projector, recovery, checkpointer, inbox) serves one small HTTP server on its
``--metrics-port``: ``/metrics`` (Prometheus, when the daemon has a registry), ``/healthz``
and ``/readyz``. Kubernetes' probes and the compose healthchecks read the last two.

- alive: the daemon's loop beat within ``stale_after_s`` (a loop that never beats, like the
  inbox's web server, is alive while this server answers);
- ready: what the daemon last reported (``Health.report``), or what its ``check`` says when
  asked; "starting" until the first report.

A stdlib WSGI server on a thread of its own: the checkpointer, on a bare install, has no
Prometheus client, and one server per daemon keeps one port to probe and publish.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from stepledger.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: The probes' logger keeps the name it had before the module moved (log filters match it).
logger = logging.getLogger("stepledger.health")

#: A loop silent this long is not alive (a batch, a rebalance and a snapshot fit well within).
STALE_AFTER_S = 120.0
#: A partition this many records or fewer from its end counts as read (ready to serve).
READY_BEHIND = 1000

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
App = Callable[[Environ, StartResponse], Iterable[bytes]]


class Health:
    """What a daemon's probes answer; its loop reports, the probe server's threads read."""

    def __init__(
        self,
        what: str,
        *,
        check: Callable[[], str | None] | None = None,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.check = check
        """Asked on each /readyz instead of the reports, when set (a daemon with no loop)."""
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._unready: str | None = f"{what} is starting"

    def beat(self) -> None:
        """The daemon's loop went round once more."""
        now = self._clock()
        with self._lock:
            self._beat = now

    def report(self, unready: str | None) -> None:
        """Ready (``None``) or why not, as the loop last found; a report is a beat too."""
        now = self._clock()
        with self._lock:
            self._beat, self._unready = now, unready

    def alive(self) -> str | None:
        """None while alive, else why not."""
        with self._lock:
            beat = self._beat
        if beat is None:
            return None
        silent = self._clock() - beat
        if silent > self._stale_after_s:
            return f"{self.what}'s loop has not gone round for {silent:.0f}s"
        return None

    def unready(self) -> str | None:
        """None when ready, else why not (a dead loop is never ready)."""
        dead = self.alive()
        if dead is not None:
            return dead
        if self.check is not None:
            return self.check()
        with self._lock:
            return self._unready


def partitions_unready(
    what: str,
    *,
    joined: bool,
    behind: Mapping[str, int | None],
    held: int = 0,
    broker_up: bool = True,
    bound: int = READY_BEHIND,
) -> str | None:
    """Why a group member is not ready: not joined, the broker lost, partitions held back, or
    one read not to within ``bound`` records of its end (``None`` behind: end not reached)."""
    if not broker_up:
        return f"{what} cannot reach the broker"
    if not joined:
        return f"{what} has no partitions assigned yet"
    if held:
        return f"{what} holds {held} partitions back (a previous owner still has them)"
    for where, records in sorted(behind.items()):
        if records is None:
            return f"{what} has not read {where} to its end yet"
        if records > bound:
            return f"{what} is {records} records behind the end of {where} (ready within {bound})"
    return None


def probe_app(health: Health, registry: CollectorRegistry | None) -> App:
    """The WSGI app: /healthz and /readyz from ``health``, anything else the metrics."""
    metrics: App | None = None
    if registry is not None:
        from prometheus_client import make_wsgi_app

        metrics = make_wsgi_app(registry)

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            problem = health.alive() if path == "/healthz" else health.unready()
            status = "200 OK" if problem is None else "503 Service Unavailable"
            body = ("ok" if problem is None else problem).encode() + b"\n"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [body]
        if metrics is None or path not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"/healthz, /readyz" + (b", /metrics" if metrics else b"") + b"\n"]
        return metrics(environ, start_response)

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: no access log."""


def serve_probes(
    port: int | None, health: Health, registry: CollectorRegistry | None = None
) -> WSGIServer | None:
    """Serve /healthz, /readyz (and /metrics) on 127.0.0.1:PORT; nothing when port is None.

    ``STEPLEDGER_METRICS_HOST`` overrides the address, for containers and pods whose probes
    come from outside the loopback. A port in use is one line (``ConfigError``).
    """
    if port is None:
        return None
    host = os.environ.get("STEPLEDGER_METRICS_HOST", "127.0.0.1")
    try:
        server = make_server(
            host, port, probe_app(health, registry), server_class=_Server, handler_class=_Quiet
        )
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    thread = threading.Thread(target=server.serve_forever, name="stepledger-probes", daemon=True)
    thread.start()
    return server

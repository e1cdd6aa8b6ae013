"""Typed urllib clients for the example services, and a helper to run one as a subprocess.

HTTP error replies raise `ServiceError`. Transport failures are left as `OSError`
(a timeout is always `TimeoutError`), because for a caller they mean something
different: the request may or may not have reached the service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

JsonObject = dict[str, Any]
ServiceKind = Literal["payments", "bookings", "email"]

START_TIMEOUT_SECONDS = 10.0
STOP_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.02
# The directory that holds the `stepledger` package, so a child process can import it
# even when the package is not installed (e.g. tests run with PYTHONPATH=src).
_IMPORT_ROOT = Path(__file__).resolve().parents[3]


class ServiceError(Exception):
    """An example service answered with an HTTP error status."""

    def __init__(self, status: int, body: JsonObject) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class _JsonClient:
    """Shared JSON-over-HTTP plumbing for the service clients."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(
        self, method: str, path: str, payload: JsonObject | None = None, *, fault: str | None = None
    ) -> JsonObject:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if fault:
            request.add_header("X-Fault", fault)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            raise ServiceError(exc.code, _decode(exc.read())) from None
        except urllib.error.URLError as exc:
            # A connect timeout arrives wrapped; unwrap so every timeout looks alike.
            if isinstance(exc.reason, TimeoutError):
                raise exc.reason from None
            raise

    def _find(self, path: str) -> JsonObject | None:
        try:
            return self._call("GET", path)
        except ServiceError as exc:
            if exc.status == 404 and exc.body.get("error") == "not_found":
                return None
            raise

    def health(self) -> bool:
        """Return True if the service answers its health check."""
        return self._call("GET", "/health").get("ok") is True

    def effects(self) -> JsonObject:
        """Return the service's effect counts: ``effects``, ``by_key`` and ``by_kind``."""
        return self._call("GET", "/effects")

    def effect_count(self, kind: str, key: str | None = None) -> int:
        """Return how many real `kind` effects happened, optionally under one key."""
        counts = self.effects()
        if key is None:
            return int(counts["effects"].get(kind, 0))
        return int(counts["by_kind"].get(kind, {}).get(key, 0))


def _decode(raw: bytes) -> JsonObject:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw.decode(errors="replace")}
    return body if isinstance(body, dict) else {"raw": body}


def _key_path(prefix: str, key: str) -> str:
    return prefix + quote(key, safe="")


class PaymentsClient(_JsonClient):
    """Client for the keyed, queryable payments service."""

    def charge(
        self, key: str, amount: int, currency: str, customer: str, *, fault: str | None = None
    ) -> JsonObject:
        """Capture a charge under an idempotency key (a replay returns the original)."""
        payload = {
            "idempotency_key": key,
            "amount": amount,
            "currency": currency,
            "customer": customer,
        }
        return self._call("POST", "/charges", payload, fault=fault)

    def find_charge(self, key: str) -> JsonObject | None:
        """Return the charge made under `key`, or None if there is none."""
        return self._find(_key_path("/charges/by-key/", key))

    def refund(self, key: str, charge_key: str, *, fault: str | None = None) -> JsonObject:
        """Refund the charge made under `charge_key`, using refund idempotency key `key`."""
        payload = {"idempotency_key": key, "charge_key": charge_key}
        return self._call("POST", "/refunds", payload, fault=fault)


class BookingsClient(_JsonClient):
    """Client for the keyed, compensatable bookings service."""

    def book(self, key: str, hotel: str, nights: int, *, fault: str | None = None) -> JsonObject:
        """Confirm a booking under an idempotency key (a replay returns the original)."""
        payload = {"idempotency_key": key, "hotel": hotel, "nights": nights}
        return self._call("POST", "/bookings", payload, fault=fault)

    def find_booking(self, key: str) -> JsonObject | None:
        """Return the booking made under `key`, or None if there is none."""
        return self._find(_key_path("/bookings/by-key/", key))

    def cancel(self, key: str, *, fault: str | None = None) -> JsonObject:
        """Cancel the booking made under `key`."""
        return self._call("POST", "/bookings/cancel", {"idempotency_key": key}, fault=fault)


class EmailClient(_JsonClient):
    """Client for the email service, which has no idempotency key."""

    def send(self, to: str, subject: str, body: str, *, fault: str | None = None) -> JsonObject:
        """Send an email; every call is a new, irreversible effect."""
        payload = {"to": to, "subject": subject, "body": body}
        return self._call("POST", "/emails", payload, fault=fault)


class ServiceStartError(RuntimeError):
    """A service subprocess exited or did not become healthy in time."""


@dataclass
class RunningService:
    """A service subprocess on loopback; stop it with `stop()` or use it as a context."""

    kind: ServiceKind
    url: str
    process: subprocess.Popen[bytes]
    state_path: Path
    log_path: Path

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> int:
        """Send SIGTERM, SIGKILL after `grace` seconds, and return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> int:
        """SIGKILL the service (a crash, no cleanup) and return the exit code."""
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def log(self) -> str:
        """Return what the service wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> RunningService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(_IMPORT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_port(port_file: Path) -> int | None:
    try:
        return int(port_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _healthy(url: str) -> bool:
    try:
        return _JsonClient(url, timeout=0.5).health()
    except (OSError, ServiceError):
        return False


def _wait_ready(service: RunningService, port_file: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise ServiceStartError(
                f"{service.kind} exited with {service.process.returncode}:\n{service.log()}"
            )
        port = _read_port(port_file)
        if port is not None and _healthy(f"http://127.0.0.1:{port}"):
            return f"http://127.0.0.1:{port}"
        time.sleep(_POLL_SECONDS)
    raise ServiceStartError(f"{service.kind} not healthy within {timeout}s:\n{service.log()}")


def start_service(
    kind: ServiceKind,
    state_path: str | os.PathLike[str],
    *,
    ignore_keys: bool = False,
    timeout: float = START_TIMEOUT_SECONDS,
) -> RunningService:
    """Launch a service subprocess on a free loopback port and wait until it is healthy."""
    state = Path(state_path)
    port_file = state.with_name(state.name + ".port")
    log_path = state.with_name(state.name + ".log")
    # A port file left by an earlier run on the same state would point at a dead port.
    port_file.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "stepledger_dev.examples.services",
        kind,
        "--port",
        "0",
        "--state",
        str(state),
        "--port-file",
        str(port_file),
    ]
    if ignore_keys:
        command.append("--ignore-keys")
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
        )
    service = RunningService(kind, "", process, state, log_path)
    try:
        service.url = _wait_ready(service, port_file, timeout)
    except BaseException:
        service.kill()
        raise
    return service

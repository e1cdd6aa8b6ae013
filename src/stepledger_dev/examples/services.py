"""Small loopback HTTP tool services that count their real side effects.

Run: ``python -m stepledger_dev.examples.services payments|bookings|email --port 0
--state PATH.sqlite [--port-file FILE] [--ignore-keys]``. Binds 127.0.0.1 only; with
``--port 0`` it picks a free port, writes it atomically to ``--port-file`` and prints
``listening on http://127.0.0.1:PORT``. SIGTERM/SIGINT stop it cleanly. State is sqlite
(WAL, one transaction per request): a SIGKILLed service keeps its committed effects.

payments (keyed, queryable): ``POST /charges`` {idempotency_key, amount, currency,
customer} -> charge (status "captured", ``replayed``); a reused key replays the original
without a new effect, or is a 409 if the parameters differ. ``GET /charges/by-key/{key}``
-> charge or 404 {"error": "not_found"}. ``POST /refunds`` {idempotency_key, charge_key}
-> refund (the charge's status becomes "refunded"), "nothing_to_undo" for an unknown
charge, "already_refunded" if refunded under another key. ``--ignore-keys`` is a
deliberately broken build whose charges ignore the key (every call is a new effect).

bookings (keyed, compensatable): ``POST /bookings`` {idempotency_key, hotel, nights} ->
booking (status "confirmed"); ``GET /bookings/by-key/{key}``; ``POST /bookings/cancel``
{idempotency_key: the booking's key} -> "cancelled", then "already_cancelled" (no new
effect), or "nothing_to_undo" for an unknown booking.

An undo that finds nothing voids the key: a charge or booking arriving later under it (a
call still in flight when recovery compensated) is refused with 409 {"error": "voided"}
and makes no effect, so "compensated" stays true whatever order the two arrive in.

email (no key, irreversible): ``POST /emails`` {to, subject, body} -> {message_id};
every call is a new effect.

All: ``GET /health`` -> {"ok": true}; ``GET /effects`` -> {"effects": {kind: n},
"by_key": {key: n}, "by_kind": {kind: {key: n}}} counting real effects, never replays
(``by_key`` sums kinds sharing a key, e.g. a booking and its cancellation).

Fault injection per request, header ``X-Fault: SPEC`` or query ``?fault=SPEC``, SPEC a
comma-separated list of: ``delay=SECONDS`` (sleep first, then handle normally: a hung
call whose effect lands after the caller gave up); ``fail-before`` (503, no effect);
``fail-after`` (perform and commit the effect, then reply 503); ``ignore-void`` (this
request ignores keys an undo voided: a service that does not remember undone keys, where a
late call after its compensation still lands); ``reject`` (422, no effect: a definite
refusal, as a mail service refusing an address).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

JsonObject = dict[str, Any]
Reply = tuple[int, JsonObject]
HOST = "127.0.0.1"
MAX_DELAY_SECONDS = 300.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, key TEXT, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_kind_key ON records (kind, key);
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT, at REAL NOT NULL);
"""


class BadRequest(Exception):
    """The request body is missing a field or has one of the wrong type."""


@dataclass(frozen=True)
class Options:
    """Process-wide switches for a running service."""

    ignore_keys: bool = False
    ignore_void: bool = False


PostHandler = Callable[[sqlite3.Connection, JsonObject, Options], Reply]


@dataclass(frozen=True)
class ServiceSpec:
    """What one kind of service exposes: effect kinds, POST routes and by-key lookups."""

    name: str
    kinds: tuple[str, ...]
    posts: dict[str, PostHandler]
    lookups: dict[str, str]


class Store:
    """Sqlite-backed state; one short-lived connection per request keeps threads apart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """Yield a connection inside a transaction that commits on success."""
        conn = self._connect()
        try:
            conn.execute("PRAGMA synchronous=FULL")
            # IMMEDIATE takes the write lock up front so two concurrent requests with
            # the same key cannot both miss the lookup and both create an effect.
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()


def find(conn: sqlite3.Connection, kind: str, key: str) -> JsonObject | None:
    """Return the first record of `kind` stored under `key`, if any."""
    row = conn.execute(
        "SELECT body FROM records WHERE kind = ? AND key = ? ORDER BY rowid LIMIT 1",
        (kind, key),
    ).fetchone()
    return None if row is None else cast(JsonObject, json.loads(row[0]))


def save(
    conn: sqlite3.Connection, kind: str, key: str | None, record_id: str, record: JsonObject
) -> None:
    """Insert or replace a record."""
    conn.execute(
        "INSERT OR REPLACE INTO records (id, kind, key, body) VALUES (?, ?, ?, ?)",
        (record_id, kind, key, json.dumps(record)),
    )


def add_effect(conn: sqlite3.Connection, kind: str, key: str | None) -> None:
    """Count one real side effect."""
    conn.execute("INSERT INTO effects (kind, key, at) VALUES (?, ?, ?)", (kind, key, time.time()))


def effect_counts(conn: sqlite3.Connection, kinds: tuple[str, ...]) -> JsonObject:
    """Summarise the effect log by kind, by key and by kind and key."""
    totals: dict[str, int] = dict.fromkeys(kinds, 0)
    by_key: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {kind: {} for kind in kinds}
    rows = conn.execute("SELECT kind, key, COUNT(*) FROM effects GROUP BY kind, key")
    for kind, key, count in rows:
        totals[kind] = totals.get(kind, 0) + count
        if key is not None:
            by_key[key] = by_key.get(key, 0) + count
            by_kind.setdefault(kind, {})[key] = count
    return {"effects": totals, "by_key": by_key, "by_kind": by_kind}


def _text(body: JsonObject, name: str, *, allow_empty: bool = False) -> str:
    value = body.get(name)
    if not isinstance(value, str) or (not value and not allow_empty):
        raise BadRequest(f"{name!r} must be a non-empty string")
    return value


def _positive_int(body: JsonObject, name: str) -> int:
    value = body.get(name)
    # bool is an int subclass; True is not a valid amount.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadRequest(f"{name!r} must be a positive integer")
    return value


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def _create_once(
    conn: sqlite3.Connection,
    kind: str,
    key: str,
    params: JsonObject,
    fields: JsonObject,
    *,
    ignore_key: bool = False,
    ignore_void: bool = False,
) -> Reply:
    """Create a `kind` record once per key; a replay must carry the same `params`.

    A key an undo voided (it found nothing to undo: the call had not arrived yet) is
    refused, so a call that arrives after its compensation makes no effect.
    """
    if not (ignore_key or ignore_void) and find(conn, f"{kind}_void", key) is not None:
        return 409, {
            "error": "voided",
            "detail": f"key {key!r} was voided by an undo that came before the {kind}",
        }
    existing = None if ignore_key else find(conn, kind, key)
    if existing is not None:
        if any(existing[name] != value for name, value in params.items()):
            return 409, {
                "error": "idempotency_conflict",
                "detail": f"key {key!r} was already used with different parameters",
            }
        return 200, {**existing, "replayed": True}
    record_id = _new_id(kind[:2])
    record = {f"{kind}_id": record_id, "idempotency_key": key, **params, **fields}
    save(conn, kind, key, record_id, record)
    add_effect(conn, kind, key)
    return 200, {**record, "replayed": False}


def _void(conn: sqlite3.Connection, kind: str, key: str) -> None:
    """Remember that an undo found nothing under this key: the key can make no effect now."""
    if find(conn, f"{kind}_void", key) is None:
        save(conn, f"{kind}_void", key, _new_id("vo"), {"idempotency_key": key, "kind": kind})


def post_charge(conn: sqlite3.Connection, body: JsonObject, opts: Options) -> Reply:
    """Capture a charge once per idempotency key (unless the build ignores keys)."""
    params = {
        "amount": _positive_int(body, "amount"),
        "currency": _text(body, "currency"),
        "customer": _text(body, "customer"),
    }
    return _create_once(
        conn,
        "charge",
        _text(body, "idempotency_key"),
        params,
        {"status": "captured"},
        ignore_key=opts.ignore_keys,
        ignore_void=opts.ignore_void,
    )


def post_refund(conn: sqlite3.Connection, body: JsonObject, opts: Options) -> Reply:
    """Refund the charge made under `charge_key`, once per refund key."""
    key = _text(body, "idempotency_key")
    charge_key = _text(body, "charge_key")
    existing = find(conn, "refund", key)
    if existing is not None:
        if existing["charge_key"] != charge_key:
            return 409, {"error": "idempotency_conflict", "detail": f"refund {key!r} reused"}
        return 200, {**existing, "replayed": True}
    charge = find(conn, "charge", charge_key)
    if charge is None:
        _void(conn, "charge", charge_key)
        return 200, {"status": "nothing_to_undo", "charge_key": charge_key, "replayed": False}
    if charge["status"] == "refunded":
        return 200, {
            "status": "already_refunded",
            "charge_id": charge["charge_id"],
            "refund_id": charge.get("refund_id"),
            "replayed": False,
        }
    refund_id = _new_id("re")
    refund = {
        "refund_id": refund_id,
        "idempotency_key": key,
        "charge_key": charge_key,
        "charge_id": charge["charge_id"],
        "amount": charge["amount"],
        "status": "refunded",
    }
    save(conn, "refund", key, refund_id, refund)
    save(
        conn,
        "charge",
        charge_key,
        charge["charge_id"],
        {**charge, "status": "refunded", "refund_id": refund_id},
    )
    add_effect(conn, "refund", key)
    return 200, {**refund, "replayed": False}


def post_booking(conn: sqlite3.Connection, body: JsonObject, opts: Options) -> Reply:
    """Confirm a booking once per idempotency key."""
    params = {"hotel": _text(body, "hotel"), "nights": _positive_int(body, "nights")}
    return _create_once(
        conn,
        "booking",
        _text(body, "idempotency_key"),
        params,
        {"status": "confirmed"},
        ignore_void=opts.ignore_void,
    )


def post_cancel(conn: sqlite3.Connection, body: JsonObject, opts: Options) -> Reply:
    """Cancel the booking made under the given key; a second cancel is a no-op."""
    key = _text(body, "idempotency_key")
    booking = find(conn, "booking", key)
    if booking is None:
        _void(conn, "booking", key)
        return 200, {"status": "nothing_to_undo", "idempotency_key": key}
    if booking["status"] == "cancelled":
        return 200, {"status": "already_cancelled", "booking_id": booking["booking_id"]}
    save(conn, "booking", key, booking["booking_id"], {**booking, "status": "cancelled"})
    add_effect(conn, "cancel", key)
    return 200, {"status": "cancelled", "booking_id": booking["booking_id"]}


def post_email(conn: sqlite3.Connection, body: JsonObject, opts: Options) -> Reply:
    """Send an email; there is no key, so every call is a new effect."""
    message = {
        "to": _text(body, "to"),
        "subject": _text(body, "subject", allow_empty=True),
        "body": _text(body, "body", allow_empty=True),
    }
    message_id = _new_id("msg")
    save(conn, "email", None, message_id, {"message_id": message_id, **message})
    add_effect(conn, "email", None)
    return 200, {"message_id": message_id, "status": "sent"}


SERVICES: dict[str, ServiceSpec] = {
    "payments": ServiceSpec(
        "payments",
        ("charge", "refund"),
        {"/charges": post_charge, "/refunds": post_refund},
        {"/charges/by-key/": "charge"},
    ),
    "bookings": ServiceSpec(
        "bookings",
        ("booking", "cancel"),
        {"/bookings": post_booking, "/bookings/cancel": post_cancel},
        {"/bookings/by-key/": "booking"},
    ),
    "email": ServiceSpec("email", ("email",), {"/emails": post_email}, {}),
}


@dataclass(frozen=True)
class Fault:
    """Faults requested for one request."""

    delay: float = 0.0
    fail_before: bool = False
    fail_after: bool = False
    ignore_void: bool = False
    reject: bool = False

    @classmethod
    def parse(cls, spec: str | None) -> Fault:
        """Parse a comma-separated fault spec such as ``delay=2,fail-after``."""
        delay, before, after, ignore_void, reject = 0.0, False, False, False, False
        for raw in (spec or "").split(","):
            part = raw.strip()
            if part.startswith("delay="):
                delay = float(part.removeprefix("delay="))
                if not 0 <= delay <= MAX_DELAY_SECONDS:
                    raise ValueError(f"delay must be within 0..{MAX_DELAY_SECONDS}")
            elif part in ("fail-before", "fail-after"):
                before, after = before or part == "fail-before", after or part == "fail-after"
            elif part == "ignore-void":
                ignore_void = True
            elif part == "reject":
                reject = True
            elif part:
                raise ValueError(f"unknown fault {part!r}")
        return cls(delay, before, after, ignore_void, reject)


class ServiceServer(ThreadingHTTPServer):
    """Threaded HTTP server carrying the service spec, its store and options."""

    daemon_threads = True

    def __init__(self, port: int, spec: ServiceSpec, store: Store, options: Options) -> None:
        super().__init__((HOST, port), ServiceHandler)
        self.spec = spec
        self.store = store
        self.options = options


class ServiceHandler(BaseHTTPRequestHandler):
    """Routes requests to the service spec, applying any injected fault."""

    def do_GET(self) -> None:
        """Handle a GET request."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Handle a POST request."""
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request access logs; tests read stdout/stderr for real problems."""

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            query_fault = parse_qs(url.query).get("fault", [None])[0]
            fault = Fault.parse(self.headers.get("X-Fault") or query_fault)
        except ValueError as exc:
            self._send(400, {"error": "bad_fault", "detail": str(exc)})
            return
        if fault.delay:
            time.sleep(fault.delay)
        if fault.fail_before:
            self._send(503, {"error": "injected_fault", "fault": "fail-before"})
            return
        if fault.reject:
            self._send(422, {"error": "injected_fault", "fault": "reject"})
            return
        try:
            status, payload = self._route(method, url.path, fault)
        except BadRequest as exc:
            status, payload = 400, {"error": "bad_request", "detail": str(exc)}
        except Exception as exc:  # a bug must still answer, or the caller hangs
            traceback.print_exc()
            status, payload = 500, {"error": "internal", "detail": repr(exc)}
        if fault.fail_after:
            status, payload = 503, {"error": "injected_fault", "fault": "fail-after"}
        self._send(status, payload)

    def _route(self, method: str, path: str, fault: Fault) -> Reply:
        server = cast(ServiceServer, self.server)
        spec = server.spec
        if method == "GET":
            if path == "/health":
                return 200, {"ok": True, "service": spec.name}
            if path == "/effects":
                with server.store.transaction(write=False) as conn:
                    return 200, effect_counts(conn, spec.kinds)
            for prefix, kind in spec.lookups.items():
                if path.startswith(prefix) and len(path) > len(prefix):
                    with server.store.transaction(write=False) as conn:
                        record = find(conn, kind, unquote(path.removeprefix(prefix)))
                    return (404, {"error": "not_found"}) if record is None else (200, record)
        elif method == "POST" and path in spec.posts:
            body = self._read_json()
            options = server.options
            if fault.ignore_void:
                options = replace(options, ignore_void=True)
            with server.store.transaction(write=True) as conn:
                return spec.posts[path](conn, body, options)
        return 404, {"error": "no_route", "detail": f"{method} {path}"}

    def _read_json(self) -> JsonObject:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def _send(self, status: int, payload: JsonObject) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def write_port_file(path: Path, port: int) -> None:
    """Write the port atomically so a polling reader never sees a partial file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def make_server(
    kind: str, state: Path, port: int = 0, *, ignore_keys: bool = False
) -> ServiceServer:
    """Create (but do not start) a service bound to 127.0.0.1."""
    return ServiceServer(port, SERVICES[kind], Store(state), Options(ignore_keys=ignore_keys))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stepledger_dev.examples.services")
    parser.add_argument("kind", choices=sorted(SERVICES))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument(
        "--ignore-keys",
        action="store_true",
        help="broken build: charges ignore their idempotency key",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one service until SIGTERM or SIGINT."""
    args = _parse_args(argv)
    server = make_server(args.kind, args.state, args.port, ignore_keys=args.ignore_keys)
    port = server.server_address[1]
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # serve_forever runs off the main thread: shutdown() deadlocks if called from the
    # thread serving, and the main thread is where signal handlers run. A short poll
    # interval keeps shutdown quick.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="serve", daemon=True
    )
    thread.start()
    if args.port_file is not None:
        write_port_file(args.port_file, port)
    print(f"listening on http://{HOST}:{port}", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

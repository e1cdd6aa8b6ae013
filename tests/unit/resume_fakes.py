"""In-memory tool services with effect counters, a movable clock and a crash, for SDK unit tests."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretStr

from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger, ResumeOptions


class Crash(BaseException):
    """Stands for a SIGKILL inside a call: not an Exception, so no outcome is recorded."""


class MovableClock:
    """A clock that ticks a millisecond per reading and can jump forward."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Services:
    """Charges (keyed, refunded), bookings (keyed, cancelled), emails (unkeyed), a read, counted."""

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, Any]] = {}
        self.bookings: dict[str, dict[str, Any]] = {}
        self.emails: list[dict[str, Any]] = []
        self.effects: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.read = Tool(name="read", effect=EffectClass.READ_ONLY, run=self._read, timeout_s=1)
        self.charge = Tool(
            name="charge",
            effect=EffectClass.IDEMPOTENT,
            policy=ResolutionPolicy.QUERY,
            keyed=True,
            timeout_s=1,
            run=self._charge,
            redrive=self._charge,
            query=lambda args, key: _found(self.charges.get(key)),
            compensate=self._refund,
        )
        self.book = Tool(
            name="book",
            effect=EffectClass.COMPENSATABLE,
            keyed=True,
            timeout_s=1,
            run=self._book,
            query=lambda args, key: _found(self.bookings.get(key)),
            compensate=self._cancel,
        )
        self.email = Tool(
            name="email", effect=EffectClass.IRREVERSIBLE, timeout_s=1, run=self._email
        )

    def tools(self) -> list[Tool]:
        return [self.read, self.charge, self.book, self.email]

    def _read(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.calls["read"] += 1
        return {"rows": [args.get("q")]}

    def _charge(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.calls["charge"] += 1
        if key not in self.charges:
            self.effects["charge"] += 1
            self.charges[key] = {"charge": key, "amount": args["amount"]}
        return self.charges[key]

    def _refund(self, args: dict[str, Any], key: str, known: Any) -> Any:
        charge = self.charges.get(key)
        if charge is None:
            return NotFound("nothing to undo")
        if charge.get("status") != "refunded":
            self.effects["refund"] += 1
            charge["status"] = "refunded"
        return {"refunded": key}

    def _book(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.calls["book"] += 1
        if key not in self.bookings:
            self.effects["book"] += 1
            self.bookings[key] = {"booking": key, "hotel": args["hotel"], "status": "confirmed"}
        return self.bookings[key]

    def _cancel(self, args: dict[str, Any], key: str, known: Any) -> Any:
        booking = self.bookings.get(key)
        if booking is None:
            return NotFound("nothing to undo")
        if booking["status"] != "cancelled":
            self.effects["cancel"] += 1
            booking["status"] = "cancelled"
        return {"cancelled": key}

    def _email(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.calls["email"] += 1
        self.effects["email"] += 1
        self.emails.append(args)
        return {"message": len(self.emails)}


def _found(record: dict[str, Any] | None) -> Found | NotFound:
    return NotFound("no record") if record is None else Found(record)


class World:
    """One in-memory log shared by successive 'processes' (ledgers), and the services."""

    def __init__(self, *, redaction_key: str | None = None, **options: Any) -> None:
        self.redaction_key = redaction_key
        self.log = InMemoryEventLog()
        self.clock = MovableClock()
        self.services = Services()
        self.dead_letters = MemoryEventLetters()
        self.options = ResumeOptions(**{"grace_s": 0.0, "resolve_timeout_s": 2.0, **options})

    def ledger(self, *, tools: bool = True, **options: Any) -> Ledger:
        """A new 'process': a fresh ledger over the same log, later in time."""
        self.clock.advance(60)
        opts = ResumeOptions(**{**self.options.__dict__, **options})
        return Ledger(
            Settings(
                fleet_id="fleet",
                producer_id="test",
                redaction_key=None if self.redaction_key is None else SecretStr(self.redaction_key),
            ),
            log=self.log,
            clock=self.clock,
            tools=self.services.tools() if tools else None,
            dead_letters=self.dead_letters,
            options=opts,
        )

    def types(self, workflow_id: str) -> list[str]:
        return [e.type for e in self.log.workflow_events(workflow_id)]


def crash_after(tool: Tool, *, effect: bool) -> Any:
    """A call that dies after (or before) doing the tool's effect."""

    def call(args: dict[str, Any], key: str) -> Any:
        if effect:
            assert tool.run is not None
            tool.run(args, key)
        raise Crash()

    return call

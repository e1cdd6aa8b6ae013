"""Tool services that count their own effects, and the tools that call them.

The services are the example services' rules in memory (``dev/examples/services.py``):

- payments (keyed, queryable, compensatable by a refund): a reused key replays the charge,
  a reused key with other parameters is refused; a refund under the charge's compensation
  key refunds once; it voids nothing (a real card processor does not);
- bookings (keyed, compensatable by a cancellation): a cancellation that finds nothing
  voids the key, so a booking arriving after its compensation makes no effect;
- email (no key, cannot be undone): every call is an effect;
- the catalogue quote (read only): no effect at all.

Every call names its *logical call* (``ref``: the workflow and the step as the agent's
code means it, whatever step id or key the SDK gave it), and every real effect is counted
per logical call: that count is what the invariant "no effect twice" reads.  An effect is
made before the call's crossing (a call and the check before it are one instant); the
crossing after it is where a process can stop with the effect made and no outcome written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepledger.domain.enums import ResolutionPolicy
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import ToolServiceError
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.simulate.scheduler import Actor, Scheduler

QUOTE, CHARGE, CAPTURE, BOOK, EMAIL, PAY = (
    "catalog.quote",
    "payments.charge",
    "payments.capture",
    "bookings.book",
    "email.send",
    "payments.pay",
)
#: Every tool's timeout (simulated seconds): the intent's deadline is this far off.
TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Effect:
    """One real effect a service made."""

    ms: int
    actor: str
    kind: str
    """``charge``, ``refund``, ``booking``, ``cancel``, ``email``, ``pay``."""
    ref: str
    key: str
    """The idempotency key of the call (of the step undone, for a refund or a cancel)."""
    tool: str
    arguments: dict[str, Any]


@dataclass
class Services:
    """Every service's state, and every effect made, in order."""

    sched: Scheduler
    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    bookings: dict[str, dict[str, Any]] = field(default_factory=dict)
    voided: set[str] = field(default_factory=set)
    effects: list[Effect] = field(default_factory=list)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    faults: dict[str, list[str]] = field(default_factory=dict)
    """Call faults armed per actor: ``after`` (effect made, the caller times out) or
    ``before`` (refused, no effect)."""

    def _effect(self, actor: Actor, kind: str, key: str, tool: str, args: dict[str, Any]) -> None:
        ref = str(args.get("ref", "?"))
        self.counts[(ref, kind)] += 1
        self.effects.append(Effect(self.sched.now_ms, actor.name, kind, ref, key, tool, args))

    def _fault(self, actor: Actor) -> str | None:
        queue = self.faults.get(actor.name)
        return queue.pop(0) if queue else None

    def call(self, actor: Actor, tool: str, body: Callable[[], Any], *, faults: bool = True) -> Any:
        """One request: the fault armed for it, the service's answer, then a crossing."""
        fault = self._fault(actor) if faults else None
        if fault == "before":
            self.sched.point(actor)
            raise ToolServiceError(f"{tool}: simulated refusal (no effect)", status=400, tool=tool)
        answer = body()
        self.sched.point(actor)
        if fault == "after":
            raise ToolServiceError(
                f"{tool}: simulated timeout after the effect", tool=tool, effect_unknown=True
            )
        return answer

    # -- payments ------------------------------------------------------------------------

    def charge(self, actor: Actor, key: str, args: dict[str, Any], tool: str = CHARGE) -> Any:
        params = {k: v for k, v in args.items() if k not in ("ref", "memo")}
        known = self.charges.get(key)
        if known is not None:
            if known["params"] != params:
                raise ToolServiceError(f"{tool}: key reused with other parameters", status=409)
            return {"charge": key, "replayed": True}
        self.charges[key] = {"params": params, "status": "captured", "ref": args.get("ref")}
        self._effect(actor, _CHARGE_KINDS.get(tool, "charge"), key, tool, args)
        return {"charge": key, "replayed": False}

    def find_charge(self, key: str) -> Found | NotFound:
        known = self.charges.get(key)
        return NotFound(f"no charge {key}") if known is None else Found({"charge": key})

    def refund(self, actor: Actor, key: str, args: dict[str, Any]) -> Any:
        known = self.charges.get(key)
        if known is None:
            return NotFound(f"no charge {key}: nothing to undo")
        if known["status"] == "refunded":
            return {"status": "already_refunded"}
        known["status"] = "refunded"
        self._effect(actor, "refund", key, CHARGE, args)
        return {"status": "refunded"}

    # -- bookings ------------------------------------------------------------------------

    def book(self, actor: Actor, key: str, args: dict[str, Any]) -> Any:
        if key in self.voided:
            raise ToolServiceError(f"{BOOK}: key {key} was voided by an undo", status=409)
        if key in self.bookings:
            return {"booking": key, "replayed": True}
        self.bookings[key] = {"status": "confirmed", "ref": args.get("ref")}
        self._effect(actor, "booking", key, BOOK, args)
        return {"booking": key, "replayed": False}

    def find_booking(self, key: str) -> Found | NotFound:
        known = self.bookings.get(key)
        return NotFound(f"no booking {key}") if known is None else Found({"booking": key})

    def cancel(self, actor: Actor, key: str, args: dict[str, Any]) -> Any:
        known = self.bookings.get(key)
        if known is None:
            self.voided.add(key)
            return NotFound(f"no booking {key}: nothing to undo")
        if known["status"] == "cancelled":
            return {"status": "already_cancelled"}
        known["status"] = "cancelled"
        self._effect(actor, "cancel", key, BOOK, args)
        return {"status": "cancelled"}

    # -- email ---------------------------------------------------------------------------

    def send(self, actor: Actor, key: str, args: dict[str, Any]) -> Any:
        self._effect(actor, "email", key, EMAIL, args)
        return {"message": f"m{len(self.effects)}"}


_CHARGE_KINDS = {PAY: "pay", CAPTURE: "capture"}


def quote(args: dict[str, Any], key: str) -> dict[str, Any]:
    """The catalogue's answer: deterministic in the trip."""
    trip = str(args.get("trip", ""))
    pick = sum(trip.encode()) % 3
    return {"amount": 100 + 10 * pick, "hotel": f"hotel-{pick}", "nights": 1 + pick}


def tools(services: Services, actor: Actor) -> ToolRegistry:
    """The tools of one actor: each call is this actor's request to the services."""
    s = services

    def call(name: str, body: Callable[[], Any], *, faults: bool = True) -> Any:
        return s.call(actor, name, body, faults=faults)

    charge = Tool(
        name=CHARGE,
        keyed=True,
        policy=ResolutionPolicy.QUERY,
        timeout_s=TIMEOUT_S,
        run=lambda a, k: call(CHARGE, lambda: s.charge(actor, k, a)),
        redrive=lambda a, k: call(CHARGE, lambda: s.charge(actor, k, a), faults=False),
        query=lambda a, k: call(CHARGE, lambda: s.find_charge(k), faults=False),
        compensate=lambda a, k, r: call(CHARGE, lambda: s.refund(actor, k, a), faults=False),
    )
    book = Tool(
        name=BOOK,
        keyed=True,
        policy=ResolutionPolicy.COMPENSATE,
        timeout_s=TIMEOUT_S,
        run=lambda a, k: call(BOOK, lambda: s.book(actor, k, a)),
        query=lambda a, k: call(BOOK, lambda: s.find_booking(k), faults=False),
        compensate=lambda a, k, r: call(BOOK, lambda: s.cancel(actor, k, a), faults=False),
    )
    email = Tool(
        name=EMAIL,
        policy=ResolutionPolicy.ESCALATE,
        correction="send a correction email",
        timeout_s=TIMEOUT_S,
        run=lambda a, k: call(EMAIL, lambda: s.send(actor, k, a)),
    )
    pay = Tool(
        name=PAY,
        keyed=True,
        policy=ResolutionPolicy.QUERY,
        secret_args=frozenset({"card"}),
        requires_approval=True,
        timeout_s=TIMEOUT_S,
        run=lambda a, k: call(PAY, lambda: s.charge(actor, k, a, PAY)),
        query=lambda a, k: call(PAY, lambda: s.find_charge(k), faults=False),
    )
    capture = Tool(
        name=CAPTURE,
        keyed=True,
        policy=ResolutionPolicy.QUERY,
        timeout_s=TIMEOUT_S,
        run=lambda a, k: call(CAPTURE, lambda: s.charge(actor, k, a, CAPTURE)),
        query=lambda a, k: call(CAPTURE, lambda: s.find_charge(k), faults=False),
    )
    read = Tool(name=QUOTE, read_only=True, timeout_s=TIMEOUT_S, run=quote)
    return ToolRegistry([read, charge, capture, book, email, pay])


#: The effect a call of each effectful tool makes.
KIND_OF = {CHARGE: "charge", CAPTURE: "capture", BOOK: "booking", EMAIL: "email", PAY: "pay"}
#: Tools whose repeat is safe: their effects are not counted against "no effect twice".
REPEAT_SAFE = frozenset({QUOTE})
#: Tools not safe to repeat: their calls run only under an open intent of their own.
NOT_REPEATABLE = frozenset({EMAIL})

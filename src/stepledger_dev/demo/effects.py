"""What the services really did, per workflow, and the check that nothing ran twice.

The services count their own effects (``/effects`` and their records), independently of
the ledger.  Charges and emails are counted per workflow from the services' records
(the customer / the recipient), so even a repeat under a fresh key would show; refunds
through the charge they undid; bookings
and cancellations are counted per idempotency key and mapped to workflows through the
keys the ledger recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stepledger_dev.chaos.evidence import email_workflow, records_by, refunds_by_customer
from stepledger_dev.examples.clients import BookingsClient, RunningService
from stepledger_dev.examples.tools import BOOKINGS

KINDS: tuple[str, ...] = ("charge", "refund", "booking", "cancel", "email")
#: Effects a workflow may cause at most once (a refund or cancellation undoes its one effect).
ONCE: tuple[str, ...] = ("charge", "refund", "booking", "cancel", "email")
UNKNOWN = "(not in the ledger)"


@dataclass(frozen=True)
class EffectCounts:
    """Real effects per workflow and kind, as the services counted them."""

    per_workflow: dict[str, dict[str, int]] = field(default_factory=dict)

    def total(self, kind: str) -> int:
        """How many effects of one kind happened in all."""
        return sum(counts.get(kind, 0) for counts in self.per_workflow.values())

    def ran_twice(self) -> list[str]:
        """Every workflow and kind with more effects than allowed, in words (empty: none)."""
        problems = [
            f"{wf}: {n} x {kind}"
            for wf, counts in sorted(self.per_workflow.items())
            if wf != UNKNOWN
            for kind in ONCE
            if (n := counts.get(kind, 0)) > 1
        ]
        unknown = self.per_workflow.get(UNKNOWN, {})
        problems += [
            f"{n} x {kind} under keys the ledger never recorded" for kind, n in unknown.items() if n
        ]
        return problems

    def left_standing(self, statuses: Mapping[str, str]) -> list[str]:
        """Every workflow that says ``compensated`` yet has an effect the services still hold.

        A charge not refunded, a booking not cancelled, an email sent: computed from the
        services' own counts, in words (empty: every compensated workflow is clean).
        """
        problems = []
        for wf, status in sorted(statuses.items()):
            if status != "compensated":
                continue
            c = self.per_workflow.get(wf, {})
            if c.get("charge", 0) > c.get("refund", 0):
                problems.append(
                    f"{wf}: charged {c.get('charge', 0)}, refunded {c.get('refund', 0)}"
                )
            if c.get("booking", 0) > c.get("cancel", 0):
                problems.append(
                    f"{wf}: booked {c.get('booking', 0)}, cancelled {c.get('cancel', 0)}"
                )
            if c.get("email", 0):
                problems.append(f"{wf}: {c['email']} email(s) sent")
        return problems


def count_effects(
    services: Mapping[str, RunningService], booking_keys: Mapping[str, str]
) -> EffectCounts:
    """Ask the services what they did (``booking_keys``: the ledger's booking key -> workflow)."""
    per: dict[str, dict[str, int]] = {}

    def add(workflow: str, kind: str, n: int) -> None:
        counts = per.setdefault(workflow, dict.fromkeys(KINDS, 0))
        counts[kind] = counts.get(kind, 0) + n

    payments = services["payments"].state_path
    for wf, n in _records(payments, "charge", "customer").items():
        add(wf, "charge", n)
    if payments.exists():
        for wf, n in refunds_by_customer(payments).items():
            add(wf, "refund", n)
    for wf, n in _records(services["email"].state_path, "email", "to").items():
        add(email_workflow(wf), "email", n)
    by_kind = BookingsClient(services["bookings"].url).effects()["by_kind"]
    for kind in ("booking", "cancel"):
        for key, n in by_kind.get(kind, {}).items():
            add(booking_keys.get(key, UNKNOWN), kind, int(n))
    return EffectCounts(per)


def booking_keys(rows: list[dict[str, object]]) -> dict[str, str]:
    """Booking idempotency key -> workflow, from projected ``steps`` rows."""
    return {
        str(r["idempotency_key"]): str(r["workflow_id"])
        for r in rows
        if r.get("tool") == BOOKINGS and r.get("idempotency_key")
    }


def _records(state: Path, kind: str, by: str) -> dict[str, int]:
    return records_by(state, kind, by) if state.exists() else {}

"""Pay-then-notify: a keyed charge that cannot be undone, then an unkeyed receipt email.

Run: ``python -m stepledger_dev.examples.pay_notify_agent WORKFLOW[@STEP:POINT] ...
[--email-fault SPEC]``.  The commonest agent shape: ``charge`` (``payments.capture``, keyed,
no refund: the pivot) then ``email`` (``email.send``, no key, no undo: it runs at most once).
Each workflow id is started, or resumed if it is already in the log.  Settings come from
``STEPLEDGER_*``, the tools from :mod:`stepledger_dev.examples.tools` (``STEPLEDGER_*_URL``).

``@STEP:POINT`` is a kill point as in :mod:`stepledger_dev.examples.trip_agent`: STEP is
``charge``/``email`` (or 1/2), POINT one of ``before_intent``, ``after_intent``,
``after_effect``, ``after_outcome``; once every workflow stopped or ended the process
SIGKILLs itself.  ``--email-fault reject`` makes the email service refuse the receipt (a
definite failure, no email sent): after the charge it goes to a person.

One JSON line per workflow reports how it ended (``completed``, ``escalated`` with the
escalation id, or ``error``).  Exit status: 0 when all completed, 3 when some wait for a
person, 1 on other errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stepledger.config import load_settings
from stepledger.errors import ToolServiceError
from stepledger.producer import Ledger, ResumeOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.tools import (
    CAPTURE,
    DEFAULT_TIMEOUT_S,
    EMAIL,
    email_tool,
)
from stepledger_dev.examples.tools import registry as example_registry
from stepledger_dev.examples.trip_agent import KillPoint, Parking, parse_target, run_all, run_step

STEPS = ("charge", "email")
AMOUNT = 2500


def tools(email_fault: str | None) -> ToolRegistry:
    """The capture (keyed, no refund) and the email, the email with a fault if asked."""
    found = example_registry()
    email = found.require(EMAIL)
    if email_fault:
        timeout = float(os.environ.get("STEPLEDGER_TOOL_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        email = email_tool(os.environ["STEPLEDGER_EMAIL_URL"], fault=email_fault, timeout_s=timeout)
    return ToolRegistry([found.require(CAPTURE), email])


def pay_then_notify(
    ledger: Ledger, workflow_id: str, kill: KillPoint | None, parking: Parking
) -> dict[str, Any]:
    """Charge the customer, then send the receipt; stop at the kill point if any."""
    charge, email = ledger.tools.require(CAPTURE), ledger.tools.require(EMAIL)
    wf = ledger.workflow(
        workflow_id, name="pay-then-notify", plan=[("charge", charge), ("email", email)]
    )
    if wf.finished:
        return {"status": wf.state.status.value, "attempt": wf.attempt}
    paid = {"amount": AMOUNT, "currency": "EUR", "customer": workflow_id}
    run_step(wf, "charge", charge, paid, kill, parking)
    receipt = {"to": f"{workflow_id}@example.test", "subject": "Your receipt", "body": "25 EUR"}
    try:
        run_step(wf, "email", email, receipt, kill, parking)
    except ToolServiceError as exc:
        step = wf.state.steps.get("email")
        if step is None or not step.escalation_open:
            raise
        # Refused after the charge: the saga cannot go back, a person decides.
        return {"status": "escalated", "escalation_id": step.escalation_id, "error": exc.message}
    wf.finish()
    return {"status": "completed", "attempt": wf.attempt}


def main(argv: list[str] | None = None) -> int:
    """Run every given workflow concurrently; die once all reached their kill points."""
    parser = argparse.ArgumentParser(prog="python -m stepledger_dev.examples.pay_notify_agent")
    parser.add_argument("targets", nargs="+", metavar="WORKFLOW[@STEP:POINT]")
    parser.add_argument("--email-fault", help="X-Fault spec for the email call, e.g. reject")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="Give up after this.")
    parser.add_argument("--grace", type=float, default=0.5, help="Seconds past a deadline.")
    opts = parser.parse_args(argv)
    targets = [parse_target(t, STEPS) for t in opts.targets]
    ledger = Ledger(
        load_settings(), tools=tools(opts.email_fault), options=ResumeOptions(grace_s=opts.grace)
    )
    return run_all(ledger, targets, opts.max_seconds, pay_then_notify)


if __name__ == "__main__":
    sys.exit(main())

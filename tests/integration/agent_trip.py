"""A trip runner that books a hotel, then stops itself (SIGSTOP) right before its next effect.

``python agent_trip.py BOOTSTRAP TOPIC WORKFLOW compensate|charge|book`` with the services'
URLs in ``STEPLEDGER_*_URL`` and the tool timeout in ``STEPLEDGER_TOOL_TIMEOUT_S``.  It opens
the workflow, books the hotel (keyed, undoable), prints ``booked`` and stops itself, as a GC
pause or a VM migration would; once the test sends SIGCONT it either unwinds the saga
(``compensate``: cancels the booking) or charges the card (``charge``: a keyed call).  With
``book`` it stops right after opening the workflow (prints ``opened``) and books once it is
continued.  The last line printed is JSON: ``{"result": ...}`` or ``{"error": CLASS,
"message": TEXT}`` (exit code 3).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from stepledger.config import Settings
from stepledger.errors import StepLedgerError
from stepledger.producer import Ledger, ResumeOptions
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS, registry

BOOKING: dict[str, Any] = {"hotel": "Hotel Lisboa", "nights": 2}
CHARGE: dict[str, Any] = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}


def main(argv: list[str]) -> int:
    bootstrap, topic, workflow_id, mode = argv[:4]
    settings = Settings(bootstrap=bootstrap, topic=topic, fleet_id="runners", producer_id="r")
    tools = registry()
    options = ResumeOptions(grace_s=0.3, resolve_timeout_s=30.0)
    with Ledger(settings, tools=tools, options=options) as ledger:
        wf = ledger.workflow(workflow_id, name="trip")
        if mode == "book":
            print("opened", flush=True)
        else:
            wf.step("book", tools.require(BOOKINGS), BOOKING)
            print("booked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            if mode == "compensate":
                result: Any = wf.compensate("the trip was called off")
            elif mode == "book":
                result = wf.step("book", tools.require(BOOKINGS), BOOKING)
            else:
                result = wf.step("charge", tools.require(PAYMENTS), CHARGE)
        except StepLedgerError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
            return 3
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A tiny agent that records one intent and SIGKILLs itself inside the tool call."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.producer import Ledger


def die(args: dict[str, Any], key: str) -> None:
    print(key, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    bootstrap, topic = sys.argv[1], sys.argv[2]
    ledger = Ledger(Settings(bootstrap=bootstrap, topic=topic, fleet_id="kill", producer_id="k"))
    wf = ledger.start("wf-kill")
    wf.step("charge", Tool(name="pay", effect="idempotent", keyed=True), {"amount": 7}, fn=die)

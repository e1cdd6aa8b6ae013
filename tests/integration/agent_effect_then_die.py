"""An agent that SIGKILLs itself inside a keyed tool's call, after (or before) its effect.

``python agent_effect_then_die.py BOOTSTRAP TOPIC WORKFLOW EFFECTS_FILE TIMEOUT_S EFFECT``:
with EFFECT=1 the tool appends its idempotency key to EFFECTS_FILE (the service did it)
before the process dies; with 0 it dies before doing anything.  Nothing records an outcome.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import stepledger as sl

if __name__ == "__main__":
    bootstrap, topic, workflow_id, effects, timeout_s, effect = sys.argv[1:7]

    def unused(args: dict[str, object], idempotency_key: str) -> sl.NotFound:
        return sl.NotFound()  # the resuming test process brings the real query hook

    @sl.tool(keyed=True, policy="query", query=unused, timeout_s=float(timeout_s))
    def charge(amount: int, *, idempotency_key: str) -> int:
        if effect == "1":
            with Path(effects).open("a") as out:
                out.write(idempotency_key + "\n")
        os.kill(os.getpid(), signal.SIGKILL)
        return amount

    settings = sl.Settings(bootstrap=bootstrap, topic=topic, producer_id="dies")
    with sl.Ledger(settings) as ledger:
        ledger.workflow(workflow_id).step("charge", charge, amount=7)

"""An agent with pipelined outcomes that SIGKILLs itself the moment a step returned.

``python agent_pipelined_then_die.py BOOTSTRAP TOPIC WORKFLOW EFFECTS_FILE STEPS KILL_AFTER``:
steps ``s0``.. of a keyed charge (policy ``query``) whose service appends the idempotency
key to EFFECTS_FILE; right after step KILL_AFTER returns (its outcome sent, perhaps not
yet acknowledged) the process dies.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import stepledger as sl
from stepledger.producer.session import ResumeOptions

if __name__ == "__main__":
    bootstrap, topic, workflow_id, effects, steps, kill_after = sys.argv[1:7]

    def unused(args: dict[str, object], idempotency_key: str) -> sl.NotFound:
        return sl.NotFound()  # the resuming test process brings the real query hook

    @sl.tool(keyed=True, policy="query", query=unused, timeout_s=30.0)
    def charge(amount: int, *, idempotency_key: str) -> int:
        with Path(effects).open("a") as out:
            out.write(idempotency_key + "\n")
        return amount

    settings = sl.Settings(bootstrap=bootstrap, topic=topic, producer_id="dies")
    ledger = sl.Ledger(settings, options=ResumeOptions(pipeline_outcomes=True))
    wf = ledger.workflow(workflow_id)
    for i in range(int(steps)):
        wf.step(f"s{i}", charge, amount=i)
        if i == int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)

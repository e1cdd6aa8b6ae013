"""A fleet of agents in one process: N workflows, each charging K times, one step a beat.

``python agent_fleet.py PREFIX N K [BEAT_S]`` with the settings in ``STEPLEDGER_*`` and the
payments service's URL in ``STEPLEDGER_PAYMENTS_URL``.  Workflows ``PREFIX-0`` ..
``PREFIX-{N-1}`` run concurrently on one event loop; each charges K times (keyed, one
customer per workflow, ``c{i}``: a restart under another prefix asks for the same calls)
with ``BEAT_S`` between steps, so a pause finds them mid-run; ``FLEET_BUG_AT=n`` makes
step n's call fail (a tool bug, fixed by running without it); ``FLEET_STEP_NAME`` renames
the steps (``charge`` by default: another plan, as a new version of the agent may have).  A
paused workflow's step waits for its unpause (``on_pause="wait"``).  It prints
``opened ID`` once each workflow is claimed, then one JSON line per workflow: ``{"id":
ID, "result": N}`` or ``{"id": ID, "error": CLASS, "message": TEXT}``; exit code 3 when
any failed.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import sys

from stepledger.config import load_settings
from stepledger.errors import StepLedgerError
from stepledger.producer import Ledger, ResumeOptions
from stepledger_dev.examples.tools import PAYMENTS, registry


def buggy(args: dict[str, object], key: str) -> object:
    """The tool bug ``FLEET_BUG_AT`` plants: the call fails before it reaches the service."""
    raise RuntimeError("tool bug: the amount was sent in the wrong unit")


async def run_one(
    ledger: Ledger, workflow_id: str, customer: str, steps: int, beat_s: float
) -> dict[str, object]:
    charge = ledger.tools.require(PAYMENTS)
    bug_at = int(os.environ.get("FLEET_BUG_AT", "-1"))
    try:
        wf = await ledger.aworkflow(workflow_id, name="fleet")
        print(f"opened {workflow_id}", flush=True)
        for n in range(steps):
            args = {"amount": 100 + n, "currency": "EUR", "customer": customer}
            step_id = f"{os.environ.get('FLEET_STEP_NAME', 'charge')}-{n}"
            await wf.astep(step_id, charge, args, fn=buggy if n == bug_at else None)
            await asyncio.sleep(beat_s)
        await wf.afinish()
    except (StepLedgerError, RuntimeError) as exc:
        return {"id": workflow_id, "error": type(exc).__name__, "message": str(exc)}
    return {"id": workflow_id, "result": steps}


async def main(prefix: str, count: int, steps: int, beat_s: float) -> int:
    options = ResumeOptions(grace_s=0.3, resolve_timeout_s=30.0, on_pause="wait")
    settings = load_settings({"app_version": os.environ.get("FLEET_APP_VERSION") or None})
    with Ledger(settings, tools=registry(), options=options) as ledger:
        runs = [run_one(ledger, f"{prefix}-{i}", f"c{i}", steps, beat_s) for i in range(count)]
        reports = await asyncio.gather(*runs)
    for report in reports:
        print(json.dumps(report), flush=True)
    return 3 if any("error" in r for r in reports) else 0


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a stuck fleet says where each thread waits
    prefix, count, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    beat = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
    sys.exit(asyncio.run(main(prefix, count, steps, beat)))

"""An agent that books a hotel, unwinds its saga and dies inside the booking's compensation.

``python agent_unwind.py WORKFLOW STEP ARGS_JSON GO_FILE`` with the settings in
``STEPLEDGER_*`` (bootstrap, topic, fleet) and the services' URLs in ``STEPLEDGER_*_URL``.
The booking succeeds (its outcome is recorded) and the agent prints ``booked``; it goes on
with other work until GO_FILE exists (the test creates it once the recovery daemon has let
go of the settled booking), then ``wf.compensate()`` records ``compensation_intended``
(acknowledged and read back: this runner owns the workflow), and the process SIGKILLs
itself inside the compensation hook, before the service is asked to cancel: nobody resumes
the workflow, so only the recovery daemon can carry the compensation through.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from stepledger.config import load_settings
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.tools import BOOKINGS, registry

WAIT_LIMIT_S = 60.0


def _die(args: dict[str, Any], key: str, known_result: Any) -> Any:
    # A real crash: no cleanup, no flush, no compensation outcome.
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    workflow_id, step_id, args_json, go = argv[:4]
    tool = registry().require(BOOKINGS).model_copy(update={"compensate": _die})
    with Ledger(load_settings(), tools=ToolRegistry([tool])) as ledger:
        wf = ledger.start(workflow_id, name="unwind")
        wf.step(step_id, tool, json.loads(args_json))
        print("booked", flush=True)
        limit = time.monotonic() + WAIT_LIMIT_S
        while not Path(go).exists() and time.monotonic() < limit:
            time.sleep(0.01)  # the agent's other work: a model turn, another call
        wf.compensate("the trip was called off")
    print(json.dumps({"error": "the compensation hook returned"}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

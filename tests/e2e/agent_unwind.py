"""An agent that books a hotel, unwinds its saga and dies inside the booking's compensation.

``python agent_unwind.py WORKFLOW STEP ARGS_JSON PAUSE_S`` with the settings in
``STEPLEDGER_*`` (bootstrap, topic, fleet) and the services' URLs in ``STEPLEDGER_*_URL``.
The booking succeeds (its outcome is recorded), the agent goes on with other work for
``PAUSE_S`` seconds (the recovery daemon checkpoints meanwhile and stops tracking the
settled step), then ``wf.compensate()`` records ``compensation_intended``
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
from typing import Any

from stepledger.config import load_settings
from stepledger.dev.examples.tools import BOOKINGS, registry
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry


def _die(args: dict[str, Any], key: str, known_result: Any) -> Any:
    # A real crash: no cleanup, no flush, no compensation outcome.
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    workflow_id, step_id, args_json, pause_s = argv[:4]
    tool = registry().require(BOOKINGS).model_copy(update={"compensate": _die})
    with Ledger(load_settings(), tools=ToolRegistry([tool])) as ledger:
        wf = ledger.start(workflow_id, name="unwind")
        wf.step(step_id, tool, json.loads(args_json))
        print("booked", flush=True)
        time.sleep(float(pause_s))  # the agent's other work: a model turn, another call
        wf.compensate("the trip was called off")
    print(json.dumps({"error": "the compensation hook returned"}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

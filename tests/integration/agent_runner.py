"""A runner of one step of an example tool that can freeze itself or wait at the step.

``python agent_runner.py BOOTSTRAP TOPIC WORKFLOW STEP TOOL ARGS_JSON [--freeze] [--hold FILE]``
with the services' URLs in ``STEPLEDGER_*_URL`` and the tool timeout in
``STEPLEDGER_TOOL_TIMEOUT_S``.  ``--freeze`` stops the process (SIGSTOP, as a GC pause or a
VM migration would) once the step's intent is acknowledged and before the call; the test
sends SIGCONT.  ``--hold FILE`` opens the workflow, prints ``ready`` and waits for FILE to
exist before the step (two runners synchronised at the same step).  The last line printed
is JSON: ``{"result": ...}`` or ``{"error": CLASS, "message": TEXT}`` (exit code 3).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from stepledger.config import Settings
from stepledger.errors import StepLedgerError
from stepledger.producer import Ledger, ResumeOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.tools import registry

HOLD_LIMIT_S = 60.0


def freeze(step_id: str) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def main(argv: list[str]) -> int:
    bootstrap, topic, workflow_id, step_id, tool_name, args_json = argv[:6]
    flags = argv[6:]
    hold = Path(flags[flags.index("--hold") + 1]) if "--hold" in flags else None
    settings = Settings(bootstrap=bootstrap, topic=topic, fleet_id="runners", producer_id="r")
    tool = registry().require(tool_name)
    if os.environ.get("RUNNER_NO_REDRIVE"):
        # The charge without a re-drive hook: a query that finds nothing records "not
        # happened" and the step runs again.
        tool = tool.model_copy(update={"redrive": None})
    run = tool.run
    assert run is not None
    tools = ToolRegistry([tool])
    options = ResumeOptions(grace_s=0.3, resolve_timeout_s=30.0)
    with Ledger(settings, tools=tools, options=options) as ledger:
        wf = ledger.workflow(workflow_id, name="runner")
        call = run
        if "--freeze" in flags:
            if hasattr(wf, "after_intent"):
                wf.after_intent = freeze
            else:  # a build without the hook: freeze where its call begins, right after the ack

                def call(args: dict[str, Any], key: str) -> Any:
                    freeze("")
                    return run(args, key)

        if hold is not None:
            print("ready", flush=True)
            limit = time.monotonic() + HOLD_LIMIT_S
            while not hold.exists() and time.monotonic() < limit:
                time.sleep(0.005)
        try:
            result = wf.step(step_id, tool, json.loads(args_json), call)
        except StepLedgerError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
            return 3
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

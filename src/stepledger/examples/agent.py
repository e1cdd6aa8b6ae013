"""A tiny agent that runs one step of an example tool, and can die at a chosen point.

Run: ``python -m stepledger.examples.agent --tool payments.charge --workflow W --step S
--args '{"amount": 5, ...}' [--kill after_intent|after_effect] [--slow SECONDS]``.
Settings come from ``STEPLEDGER_*`` (bootstrap, topic, fleet), the tools from
``stepledger.examples.tools:registry`` (``STEPLEDGER_*_URL``).  ``--kill after_intent``
SIGKILLs the process once the intent is durable and before the call; ``after_effect``
once the service performed the effect and before the outcome is recorded.  ``--slow``
makes a live but slow agent: the outcome is recorded that many seconds after the effect.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from stepledger.config import load_settings
from stepledger.examples.tools import registry
from stepledger.producer.ledger import Ledger

KILL_POINTS = ("after_intent", "after_effect")


def _die() -> None:
    # A real crash: no cleanup, no flush, no outcome.
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """Run one step and print its result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m stepledger.examples.agent")
    parser.add_argument("--tool", required=True)
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--args", default="{}")
    parser.add_argument("--kill", choices=KILL_POINTS)
    parser.add_argument("--slow", type=float, default=0.0)
    opts = parser.parse_args(argv)
    tool = registry().require(opts.tool)
    run = tool.run
    assert run is not None

    def call(arguments: dict[str, Any], key: str) -> Any:
        if opts.kill == "after_intent":
            _die()
        result = run(arguments, key)
        if opts.kill == "after_effect":
            _die()
        if opts.slow:
            time.sleep(opts.slow)
        return result

    with Ledger(load_settings()) as ledger:
        workflow = ledger.start(opts.workflow, name="example-agent")
        result = workflow.step(opts.step, tool, json.loads(opts.args), call)
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

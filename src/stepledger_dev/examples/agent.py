"""A tiny agent that runs one step of an example tool, and can die at a chosen point.

Run: ``python -m stepledger_dev.examples.agent --tool payments.charge --workflow W --step S
--args '{"amount": 5, ...}' [--kill after_intent|after_effect] [--slow SECONDS]``.
Settings come from ``STEPLEDGER_*`` (bootstrap, topic, fleet), the tools from
``stepledger_dev.examples.tools:registry`` (``STEPLEDGER_*_URL``).  ``--kill after_intent``
SIGKILLs the process once the intent is durable and before the call; ``after_effect``
once the service performed the effect and before the outcome is recorded.  ``--slow``
makes a live but slow agent: the outcome is recorded that many seconds after the effect;
``--fault delay=3`` makes the service itself slow, so the effect lands late.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from stepledger.config import load_settings
from stepledger.errors import StepCompensatedError
from stepledger.producer.ledger import Ledger
from stepledger_dev.examples.tools import (
    BOOKINGS,
    EMAIL,
    ENV_URLS,
    PAYMENTS,
    make_registry,
    registry,
)

KILL_POINTS = ("after_intent", "after_effect")


def _die() -> None:
    # A real crash: no cleanup, no flush, no outcome.
    os.kill(os.getpid(), signal.SIGKILL)


def _faulty_run(name: str, fault: str) -> Callable[[dict[str, Any], str], Any]:
    env = os.environ
    urls = {tool: env.get(var) for tool, var in ENV_URLS.items()}
    # The service sleeps on purpose: the agent's own HTTP call must outwait it, while the
    # intent's deadline still comes from the tool's normal timeout.
    slow = make_registry(urls[PAYMENTS], urls[BOOKINGS], urls[EMAIL], fault, timeout_s=60.0)
    run = slow.require(name).run
    assert run is not None
    return run


def main(argv: list[str] | None = None) -> int:
    """Run one step and print its result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m stepledger_dev.examples.agent")
    parser.add_argument("--tool", required=True)
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--args", default="{}")
    parser.add_argument("--kill", choices=KILL_POINTS)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--fault", help="X-Fault spec for the service call, e.g. delay=3")
    opts = parser.parse_args(argv)
    tool = registry().require(opts.tool)
    run = tool.run if opts.fault is None else _faulty_run(opts.tool, opts.fault)
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
        try:
            result = workflow.step(opts.step, tool, json.loads(opts.args), call)
        except StepCompensatedError as exc:
            # The log decided first (recovery undid the step while this call was slow).
            print(json.dumps({"error": type(exc).__name__, "decision": exc.decision}), flush=True)
            return 3
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

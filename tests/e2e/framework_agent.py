"""A trip agent (charge -> book -> email -> answer) on one framework, with a scripted model.

``python tests/e2e/framework_agent.py FRAMEWORK WORKFLOW [--kill-after TOOL]`` runs (or
resumes) the workflow with the example services' tools (``STEPLEDGER_*_URL``).  The model
is the framework's own offline test model, scripted: it asks for the next tool of the plan
given how many tool results it has seen, then answers.  Each real model call appends its
turn to ``FRAMEWORK_MODEL_LOG`` (a file), so a test can see that a recorded turn was never
asked again.  ``--kill-after TOOL`` SIGKILLs the process right after that tool's effect (the
service did it, no outcome recorded), or with ``--kill-when intent`` right after its intent
(nothing called).  With ``FRAMEWORK_REWORD=1`` the prompt carries the time (no recorded
model turn matches: the model is asked again) and the model words the charge's memo and
the email's body otherwise.  The run ends with one JSON line: ``completed`` (with
the answer), ``compensated`` (recovery undid the booking: the saga is unwound),
``escalated`` (with the escalation id).
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

import stepledger as sl
from stepledger.domain.tools import Tool
from stepledger_dev.examples.tools import BOOKINGS, EMAIL, PAYMENTS, registry

PLAN: list[tuple[str, dict[str, Any]]] = [
    (PAYMENTS, {"amount": 900, "currency": "EUR", "customer": "ana", "memo": "trip"}),
    (BOOKINGS, {"hotel": "Ritz", "nights": 2}),
    (EMAIL, {"subject": "your trip", "body": "booked"}),
]
#: What a model asked again words its own way: the free text of the charge and the email.
REWORDED = {PAYMENTS: {"memo": "Ana's trip: 2 nights at the Ritz"}, EMAIL: {"body": "Done!"}}
REWORD_ENV = "FRAMEWORK_REWORD"
Runner = Callable[[sl.Workflow, dict[str, Tool]], Any]


def log_model_call(turn: int) -> None:
    """Note one real model call (the test reads them back)."""
    with open(os.environ["FRAMEWORK_MODEL_LOG"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"turn": turn}) + "\n")


def plan_for(workflow_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The scripted plan; the email goes to an address named after the workflow.

    With ``FRAMEWORK_REWORD=1`` the model words the free-text arguments otherwise.
    """
    reword = os.environ.get(REWORD_ENV) == "1"
    plan = [(tool, {**args, **(REWORDED.get(tool, {}) if reword else {})}) for tool, args in PLAN]
    return [
        (tool, {**args, "to": f"{workflow_id}@example.test"} if tool == EMAIL else args)
        for tool, args in plan
    ]


def prompt() -> str:
    """The user's prompt; a re-worded run's carries the time, so no recorded turn matches."""
    if os.environ.get(REWORD_ENV) == "1":
        return f"Book my trip (it is {time.strftime('%H:%M:%S')})"
    return "Book my trip"


def killing(tool: Tool, *, before_effect: bool = False) -> Tool:
    """The tool, SIGKILLing the process right after its effect (no outcome recorded), or
    right after its intent (``before_effect``: nothing called)."""
    run = tool.run
    assert run is not None

    def run_then_die(args: dict[str, Any], key: str) -> Any:
        if not before_effect:
            run(args, key)
        os.kill(os.getpid(), signal.SIGKILL)

    return tool.model_copy(update={"run": run_then_die})


def runner(framework: str) -> Runner:
    """The framework's agent for the trip (imported only when asked for)."""
    if framework == "openai-agents":
        from tests.e2e.framework_openai import run_trip

        return run_trip
    if framework == "pydantic-ai":
        from tests.e2e.framework_pydantic_ai import run_trip as run_pydantic_ai

        return run_pydantic_ai
    if framework == "langgraph":
        from tests.e2e.framework_langgraph import run_trip as run_langgraph

        return run_langgraph
    raise SystemExit(f"unknown framework {framework!r}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework")
    parser.add_argument("workflow")
    parser.add_argument("--kill-after", default=None)
    parser.add_argument("--kill-when", choices=("intent", "effect"), default="effect")
    opts = parser.parse_args()
    # The trip's three tools (the registry also holds the pay-then-notify capture).
    tools = {t.name: t for t in registry() if t.name in (PAYMENTS, BOOKINGS, EMAIL)}
    if opts.kill_after:
        before = opts.kill_when == "intent"
        tools[opts.kill_after] = killing(tools[opts.kill_after], before_effect=before)
    run = runner(opts.framework)
    options = sl.ResumeOptions(grace_s=0.5)
    with sl.Ledger(sl.load_settings(), tools=list(tools.values()), options=options) as ledger:
        wf = ledger.workflow(opts.workflow)
        try:
            answer = run(wf, tools)
        except sl.StepCompensatedError as exc:
            undone = wf.compensate(f"recovery undid {exc.step_id}")
            report = {"status": "compensated", "undone": undone, "step": exc.step_id}
        except sl.StepInDoubtError as exc:
            report = {"status": "escalated", "escalation_id": exc.escalation_id}
        else:
            wf.finish()
            report = {"status": "completed", "answer": answer}
    print(json.dumps(report), flush=True)
    return 0 if report["status"] != "escalated" else 3


if __name__ == "__main__":
    sys.exit(main())

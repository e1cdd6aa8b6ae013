"""An example multi-step agent: quote (read) -> charge -> book -> email, resumable and killable.

Run: ``python -m stepledger_dev.examples.trip_agent WORKFLOW[@STEP:POINT] ...``.  Each workflow
id is started, or resumed if it is already in the log (``Ledger.workflow``).  Settings
come from ``STEPLEDGER_*``; the payments, bookings and email tools from
``stepledger_dev.examples.tools`` (``STEPLEDGER_*_URL``, ``STEPLEDGER_TOOL_TIMEOUT_S``).

``@STEP:POINT`` is a kill point: STEP is a step number (1-4) or id (quote, charge, book,
email), POINT one of ``before_intent``, ``after_intent`` (intent durable, no call),
``after_effect`` (the service did it, no outcome) and ``after_outcome``.  Several
workflows run concurrently; each one that reaches its kill point stops there, and once
every workflow has stopped or ended the process SIGKILLs itself: a real crash with each
workflow at its own boundary.  ``frozen_after_intent`` (intent acknowledged, before the
call's checks) stops the process instead (SIGSTOP, as a GC pause or a VM migration
would): once continued (SIGCONT) its workflows go on from there, and must not call.
A ``+reword`` suffix (``WORKFLOW@STEP:POINT+reword``) makes every resumed attempt word the
charge's memo and the email's body otherwise, as a model asked again would: the steps that
were recorded must be matched by what identifies them, never refused nor made again.
``second_runner`` opens the workflow twice (the second open is a resume while the first
runner is alive) and runs both to the step, synchronised there: one effect, and the older
runner is told it was taken over.  ``STEPLEDGER_DEV_CLOCK_SKEW_S`` moves the agent's wall
clock by that many seconds.

One JSON line per workflow reports how it ended (``completed``, ``escalated``,
``approval_pending``, ``dead_lettered`` or ``error``).  Exit status: 0 when all completed,
3 when some wait for a human, 1 on other errors.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from stepledger.config import load_settings
from stepledger.domain.enums import EffectClass
from stepledger.domain.factory import utc_now
from stepledger.domain.ids import digest
from stepledger.domain.tools import Tool
from stepledger.errors import (
    ApprovalPendingError,
    StepCompensatedError,
    StepInDoubtError,
    StepLedgerError,
    WorkflowDeadLetteredError,
)
from stepledger.producer import Ledger, ResumeOptions, SnapshotTailReader, Workflow
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.tools import BOOKINGS, DEFAULT_TIMEOUT_S, EMAIL, PAYMENTS, email_tool
from stepledger_dev.examples.tools import registry as example_registry

STEPS = ("quote", "charge", "book", "email")
#: The step boundaries a process is killed at (SIGKILL once every workflow reached its own).
BOUNDARIES = ("before_intent", "after_intent", "after_effect", "after_outcome")
POINTS = (*BOUNDARIES, "frozen_after_intent", "second_runner")
"""Every point: the boundaries, a runner stopped (SIGSTOP) after its intent until the harness
continues it, and two live runners at one step."""
FROZEN = "frozen_after_intent"
SECOND = "second_runner"
REWORD = "+reword"
#: How long two runners of one workflow wait for each other at their step.
MEET_S = 30.0
#: The status of a workflow whose thread raised something outside the exception tree.
BUG = "bug"
SKEW_ENV = "STEPLEDGER_DEV_CLOCK_SKEW_S"
QUOTE = "catalog.quote"
HOTELS = ("Hotel Astoria", "Hotel Bristol", "Hotel Central", "Hotel Dorian")


@dataclass(frozen=True)
class KillPoint:
    """Where one workflow of this process stops (and the process then dies)."""

    step: str
    point: str


class Parking:
    """Where workflows stop: at their kill point (until the kill) or at their end (reported)."""

    def __init__(self) -> None:
        self.parked = 0
        self.reports: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self._forever = threading.Event()
        self.frozen = 0
        self._thawed = threading.Event()
        self.meetings: dict[str, threading.Barrier] = {}
        """Where two runners of one workflow wait for each other (second_runner)."""

    def freeze(self) -> None:
        """Stop here until the process was stopped and continued (see ``run_all``)."""
        with self.changed:
            self.parked += 1
            self.frozen += 1
            self.changed.notify_all()
        self._thawed.wait()
        with self.changed:
            self.parked -= 1

    def thaw(self) -> None:
        """Let the frozen workflows go on."""
        self._thawed.set()

    def park(self) -> None:
        """Stop here until the process is killed."""
        with self.changed:
            self.parked += 1
            self.changed.notify_all()
        self._forever.wait()

    def report(self, report: dict[str, Any]) -> None:
        """Record and print how one workflow ended."""
        with self.changed:
            self.reports.append(report)
            print(json.dumps(report), flush=True)
            self.changed.notify_all()

    def wait_all(self, total: int, timeout: float) -> bool:
        """Wait until every workflow stopped or ended; False on timeout."""
        with self.changed:
            return self.changed.wait_for(lambda: self.parked + len(self.reports) >= total, timeout)


def quote_tool() -> Tool:
    """A read-only catalog lookup: the hotel and price for a trip (deterministic)."""

    def run(args: dict[str, Any], key: str) -> dict[str, Any]:
        pick = int(digest(args["trip"]), 16)
        return {"hotel": HOTELS[pick % len(HOTELS)], "nights": 1 + pick % 3, "amount": 5000}

    return Tool(name=QUOTE, effect=EffectClass.READ_ONLY, run=run, timeout_s=5.0)


def tools(approval: bool) -> ToolRegistry:
    """The agent's tools: the example services' tools plus the catalog quote."""
    found = example_registry()
    chosen = ToolRegistry([quote_tool(), found.require(PAYMENTS), found.require(BOOKINGS)])
    email = found.require(EMAIL)
    if approval:
        timeout = float(os.environ.get("STEPLEDGER_TOOL_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        email = email_tool(
            os.environ["STEPLEDGER_EMAIL_URL"], timeout_s=timeout, requires_approval=True
        )
    chosen.register(email)
    return chosen


def trip(
    ledger: Ledger,
    workflow_id: str,
    kill: KillPoint | None,
    parking: Parking,
    *,
    reword: bool = False,
) -> dict[str, Any]:
    """Run (or resume) one trip workflow to its end, stopping at its kill point if any.

    ``reword``: a resumed attempt words the free-text arguments otherwise.
    """
    by_step = {
        "quote": ledger.tools.require(QUOTE),
        "charge": ledger.tools.require(PAYMENTS),
        "book": ledger.tools.require(BOOKINGS),
        "email": ledger.tools.require(EMAIL),
    }

    def open_it() -> Workflow:
        return ledger.workflow(
            workflow_id, name="trip", max_attempts=_max_attempts(), plan=list(by_step.items())
        )

    wf = open_it()
    if kill is not None and kill.point == SECOND and not wf.finished:
        _older_runner(wf, by_step, workflow_id, kill, parking)
        wf = open_it()  # a resume while the first runner is alive: it owns the workflow now
    if wf.finished:
        return {"status": wf.state.status.value, "attempt": wf.attempt}
    try:
        return _trip_steps(wf, by_step, workflow_id, kill, parking, reword=reword)
    except StepCompensatedError:
        # Recovery undid an in-doubt step (its policy is compensate), first in the log: the
        # trip cannot go on as planned, so the saga unwinds what else it can undo.
        wf.compensate("a step was undone by recovery")
        return {"status": "compensated", "attempt": wf.attempt}


def _older_runner(
    wf: Workflow, by_step: dict[str, Tool], workflow_id: str, kill: KillPoint, parking: Parking
) -> None:
    """Run the first runner on, in a thread; it meets the second at the kill step."""
    parking.meetings[workflow_id] = threading.Barrier(2, timeout=MEET_S)

    def run() -> None:
        try:
            ended = outcome_of(lambda: _trip_steps(wf, by_step, workflow_id, kill, parking))
        finally:
            # Ended before the meeting (an escalation, a takeover): the second runner must
            # not wait the barrier's whole timeout for it.
            parking.meetings[workflow_id].abort()
        print(json.dumps({"superseded_runner": workflow_id, **ended}), flush=True)

    threading.Thread(target=run, daemon=True).start()


def _trip_steps(
    wf: Workflow,
    by_step: dict[str, Tool],
    workflow_id: str,
    kill: KillPoint | None,
    parking: Parking,
    *,
    reword: bool = False,
) -> dict[str, Any]:
    quote = run_step(wf, "quote", by_step["quote"], {"trip": workflow_id}, kill, parking)
    anew = reword and wf.attempt > 1  # a model asked again words its free text its own way
    charge = {"amount": quote["amount"], "currency": "EUR", "customer": workflow_id}
    arguments = {
        "charge": {**charge, "memo": f"Trip {workflow_id}, resumed" if anew else "trip"},
        "book": {"hotel": quote["hotel"], "nights": quote["nights"]},
        "email": {
            "to": f"{workflow_id}@example.test",
            "subject": "Your trip",
            "body": f"Your stay at {quote['hotel']} is confirmed." if anew else quote["hotel"],
        },
    }
    for step_id in ("charge", "book", "email"):
        run_step(wf, step_id, by_step[step_id], arguments[step_id], kill, parking)
    wf.finish()
    return {"status": "completed", "attempt": wf.attempt}


def run_step(
    wf: Workflow,
    step_id: str,
    tool: Tool,
    arguments: dict[str, Any],
    kill: KillPoint | None,
    parking: Parking,
) -> Any:
    """Run one step, stopping at its kill point (before, after the intent or the effect)."""
    point = kill.point if kill is not None and kill.step == step_id else None
    if point == "before_intent":
        parking.park()
    meet = parking.meetings.get(wf.workflow_id) if point == SECOND else None
    if meet is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            meet.wait()
    if point == FROZEN:

        def frozen(_: str) -> None:
            wf.after_intent = None
            parking.freeze()

        wf.after_intent = frozen
    run = tool.run
    assert run is not None

    def call(args: dict[str, Any], key: str) -> Any:
        if point == "after_intent":
            parking.park()
        result = run(args, key)
        if point == "after_effect":
            parking.park()
        return result

    result = wf.step(step_id, tool, arguments, call)
    if point == "after_outcome":
        parking.park()
    return result


def _max_attempts() -> int:
    return int(os.environ.get("STEPLEDGER_MAX_ATTEMPTS", "5"))


def outcome_of(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one workflow and turn how it ended into a report."""
    try:
        return run()
    except StepInDoubtError as exc:
        return {"status": "escalated", "escalation_id": exc.escalation_id, "error": exc.message}
    except ApprovalPendingError as exc:
        return {"status": "approval_pending", "step_id": exc.step_id, "error": exc.message}
    except WorkflowDeadLetteredError as exc:
        return {"status": "dead_lettered", "escalation_id": exc.escalation_id, "error": exc.message}
    except StepLedgerError as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc.message}"}
    except Exception as exc:  # a bug: reported (the harness fails the run), never a hung thread
        traceback.print_exc()
        return {"status": BUG, "error": f"{type(exc).__name__}: {exc}"}


def parse_target(text: str, steps: tuple[str, ...] = STEPS) -> tuple[str, KillPoint | None]:
    """Parse ``WORKFLOW[@STEP:POINT]`` (STEP a number from 1 or one of ``steps``)."""
    workflow_id, sep, where = text.partition("@")
    if not sep:
        return workflow_id, None
    step, _, point = where.partition(":")
    if step.isdigit() and 1 <= int(step) <= len(steps):
        step = steps[int(step) - 1]
    if step not in steps or point not in POINTS:
        names = ", ".join(steps)
        raise SystemExit(f"bad kill point {where!r}: STEP (1-{len(steps)} or {names}):POINT")
    return workflow_id, KillPoint(step, point)


def main(argv: list[str] | None = None) -> int:
    """Run every given workflow concurrently; die once all reached their kill points."""
    parser = argparse.ArgumentParser(prog="python -m stepledger_dev.examples.trip_agent")
    parser.add_argument("targets", nargs="+", metavar="WORKFLOW[@STEP:POINT][+reword]")
    parser.add_argument(
        "--db",
        type=Path,
        default=os.environ.get("STEPLEDGER_DB"),
        help="Projector DuckDB file (STEPLEDGER_DB): read workflows from its snapshot + tail.",
    )
    parser.add_argument("--max-seconds", type=float, default=600.0, help="Give up after this.")
    parser.add_argument("--approval", action="store_true", help="The email needs an approval.")
    parser.add_argument("--approval-wait", type=float, default=0.0, help="Seconds to wait for it.")
    parser.add_argument("--wait-for-recovery", action="store_true")
    parser.add_argument("--grace", type=float, default=0.5, help="Seconds past a deadline.")
    opts = parser.parse_args(argv)
    targets = [parse_target(t.removesuffix(REWORD)) for t in opts.targets]
    reworded = {wf for (wf, _), t in zip(targets, opts.targets, strict=True) if t.endswith(REWORD)}
    settings = load_settings()
    options = ResumeOptions(
        grace_s=opts.grace,
        wait_for_recovery=opts.wait_for_recovery,
        approval_wait_s=opts.approval_wait,
    )
    reader = None if opts.db is None else SnapshotTailReader(settings, opts.db)
    skew = timedelta(seconds=float(os.environ.get(SKEW_ENV, "0") or 0))
    ledger = Ledger(
        settings,
        tools=tools(opts.approval),
        reader=reader,
        options=options,
        clock=lambda: utc_now() + skew,
    )
    return run_all(ledger, targets, opts.max_seconds, reworded=reworded)


#: One workflow of an example agent, run (or resumed) to its end or its kill point.
RunOne = Callable[..., dict[str, Any]]


def run_all(
    ledger: Ledger,
    targets: list[tuple[str, KillPoint | None]],
    limit: float,
    run_one: RunOne = trip,
    *,
    reworded: frozenset[str] | set[str] = frozenset(),
) -> int:
    """Run every target concurrently, report each, and die once all reached their kill points.

    ``reworded``: workflows whose resumed attempts word their free text otherwise (``run_one``
    then takes ``reword=True``).
    """
    parking = Parking()
    # The harness asks where a process it is about to kill was (every thread, to stderr).
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def one(workflow_id: str, kill: KillPoint | None) -> None:
        run = functools.partial(run_one, reword=True) if workflow_id in reworded else run_one
        ended = outcome_of(lambda: run(ledger, workflow_id, kill, parking))
        parking.report({"workflow": workflow_id, **ended})

    for target in targets:
        threading.Thread(target=one, args=target, daemon=True).start()
    if not parking.wait_all(len(targets), limit):
        print(json.dumps({"status": "error", "error": f"not done in {limit:g}s"}), flush=True)
        faulthandler.dump_traceback(all_threads=True)  # where it hangs, in the agents' log
        return 1
    if parking.frozen:
        # Paused, not dead: the harness resumes the workflows elsewhere, then continues us.
        os.kill(os.getpid(), signal.SIGSTOP)
        parking.thaw()
        with parking.changed:
            ended = parking.changed.wait_for(lambda: len(parking.reports) >= len(targets), limit)
        if not ended:
            print(json.dumps({"status": "error", "error": f"not done {limit:g}s after SIGCONT"}))
            faulthandler.dump_traceback(all_threads=True)
            return 1
    if parking.parked:
        # A real crash: no flush, no outcome, every parked workflow at its boundary.
        os.kill(os.getpid(), signal.SIGKILL)
    ledger.close()
    statuses = {r["status"] for r in parking.reports}
    if statuses <= {"completed"}:
        return 0
    return 1 if "error" in statuses else 3


if __name__ == "__main__":
    sys.exit(main())

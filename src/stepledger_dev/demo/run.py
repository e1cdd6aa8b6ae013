"""The demo's script: start the stack, crash an agent mid-step, watch recovery, show the end.

Acts: (1) a local stack (broker unless ``--bootstrap``, the example services, projector
and recovery daemon); (2) one agent process runs four trips and SIGKILLs itself once three
of them reached their crash points; (3) recovery's decisions are printed as they reach the
log; (4) the killed trips are resumed; (5) the projector's ``steps`` table, the effects the
services counted (checked: nothing ran twice) and the escalation waiting for a human.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from stepledger.config import Settings
from stepledger.daemon.process import sigterm_interrupts
from stepledger.domain.events import Event
from stepledger.humanqueue.escalations import OpenEscalation, read_queue
from stepledger.log import codec_for
from stepledger.projector.snapshot import latest_snapshot
from stepledger.readers.query import QueryResult, run_query, to_records
from stepledger_dev.demo import show
from stepledger_dev.demo.effects import EffectCounts, booking_keys, count_effects
from stepledger_dev.demo.failure import DemoError
from stepledger_dev.demo.inbox import start_inbox, wait_for_person
from stepledger_dev.demo.script import TRIPS, killed
from stepledger_dev.demo.watch import LogWatcher, reached, settled
from stepledger_dev.examples.tools import EMAIL
from stepledger_dev.stack import LocalStack, StackOptions

AGENT = [sys.executable, "-m", "stepledger_dev.examples.trip_agent"]
STEPS_SQL = f"SELECT {', '.join(show.STEP_COLUMNS)} FROM steps ORDER BY workflow_id, sequence"
KEYS_SQL = "SELECT workflow_id, tool, idempotency_key FROM steps"
AGENT_TIMEOUT_S = 60.0
WAIT_S = 45.0


@dataclass(frozen=True)
class DemoOptions:
    """Where the demo runs and what it keeps."""

    bootstrap: str | None = None
    """Your broker (HOST:PORT); None starts a local one on loopback."""
    keep: Path | None = None
    """Keep logs, service state and the DuckDB files here (default: a removed temp dir)."""


@dataclass
class DemoResult:
    """What the demo found."""

    statuses: dict[str, str] = field(default_factory=dict)
    effects: EffectCounts = field(default_factory=EffectCounts)
    escalations: list[OpenEscalation] = field(default_factory=list)
    ran_twice: list[str] = field(default_factory=list)
    left_standing: list[str] = field(default_factory=list)
    """Workflows that ended compensated with an effect the services still hold."""
    left_running: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0
    keep: bool = False


class _Narrator:
    """Prints lines and tables; once the crash is told, the log's decisions as they arrive."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.crashed_at: float | None = None
        self._held: list[Event] = []
        self._lock = threading.Lock()

    def say(self, text: str = "") -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def heading(self, text: str) -> None:
        self.console.print()
        self.console.print(f"== {text}", style="bold", markup=False, highlight=False)

    def on_event(self, event: Event) -> None:
        with self._lock:
            if self.crashed_at is not None:
                self._line(event, f"+{time.monotonic() - self.crashed_at:.1f}s")
            elif show.by_recovery(event):
                # A slow machine may decide before the crash is told: shown then, not lost.
                self._held.append(event)

    def go_live(self, crashed_at: float) -> None:
        """From now on print decisions as they arrive, after any that came early."""
        with self._lock:
            self.crashed_at = crashed_at
            for event in self._held:
                self._line(event, "early")
            self._held.clear()

    def _line(self, event: Event, when: str) -> None:
        line = show.decision(event)
        if line is not None:
            self.say(f"  {when:>6}  {line}")


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> DemoResult:
    """Run the whole demo; every process it started is stopped before it returns or raises."""
    began = time.monotonic()
    out = _Narrator(console)
    result = DemoResult(keep=options.keep is not None)
    with sigterm_interrupts(), _workdir(options.keep) as workdir:
        stack = LocalStack(workdir, _stack_options(options), base=settings)
        try:
            _act_one(stack, out)
            _play(stack, out, result, keep=options.keep is not None)
        finally:
            stack.stop()
            result.left_running = stack.alive()
            _cleanup_line(stack, out, result, options.keep)
    result.seconds = time.monotonic() - began
    out.say(f"demo finished in {result.seconds:.1f}s")
    return result


def _stack_options(options: DemoOptions) -> StackOptions:
    return StackOptions(
        bootstrap=options.bootstrap,
        topic_prefix="stepledger-demo",
        fleet_id="demo",
        tool_timeout_s=1.0,
        max_attempts=3,
        recovery_grace="500ms",
        snapshot_interval_s=0.5,
        # Their logs are files in the work directory (kept with --keep, quoted on failure).
        daemon_log_level="INFO",
    )


def _act_one(stack: LocalStack, out: _Narrator) -> None:
    out.heading("1. The stack: every part a real process")
    stack.start()
    where = "your broker" if stack.broker is None else "local broker (Tansu, memory storage)"
    out.say(f"{where} on {stack.settings.bootstrap}, topic {stack.settings.topic}")
    for kind, service in stack.services.items():
        out.say(f"{kind:8} service pid {service.process.pid:>7} at {service.url}")
    stack.start_daemons()
    for name, proc in stack.procs.items():
        pid = proc.process.pid if proc.process else 0
        out.say(f"{name:8} daemon  pid {pid:>7} ({' '.join(proc.argv[3:5])} ...)")


def _play(stack: LocalStack, out: _Narrator, result: DemoResult, *, keep: bool) -> None:
    watcher = LogWatcher(stack.settings, out.on_event).start()
    try:
        crashed_at = _crash(stack, out, watcher, result)
        _recover(stack, out, watcher, crashed_at)
        _resume(stack, out, watcher, result)
        rows = _steps(stack, out, watcher)
        _effects(stack, out, rows, result)
        _escalations(stack, out, result)
        if keep and result.escalations:
            # A person answers in the browser; the watcher narrates the answer as it lands.
            wait_for_person(out.say, start_inbox(stack))
    finally:
        watcher.stop()


def _crash(stack: LocalStack, out: _Narrator, watcher: LogWatcher, result: DemoResult) -> float:
    out.heading("2. One agent process runs four trips (quote -> charge -> book -> email)")
    for trip in TRIPS:
        out.say(f"{trip.workflow_id}: {trip.story}")
    run = _run_agent(stack, [t.target for t in TRIPS], "first")
    crashed_at = time.monotonic()
    result.statuses.update(run.reports)
    if run.code != -signal.SIGKILL:
        raise DemoError(f"the agent was to die of SIGKILL, it exited {run.code}: {_tail(stack)}")
    stuck = killed()
    out.say(f"agent process {run.pid} died of SIGKILL with {len(stuck)} trips mid-step")
    # Wait for everything the broker acknowledged to the agent before it died.
    if not watcher.wait_seen(run.acked, WAIT_S) or not watcher.wait(reached(stuck), 0):
        raise DemoError(f"the agent's acknowledged events were not all read in {WAIT_S:g}s")
    out.console.print(show.crash_table(TRIPS, watcher.snapshot()))
    return crashed_at


def _recover(stack: LocalStack, out: _Narrator, watcher: LogWatcher, crashed_at: float) -> None:
    out.heading("3. The recovery daemon resolves each in-doubt step, as it happens")
    out.say("an intent's deadline is its tool's 1s timeout; recovery waits 500ms past it")
    out.say("(seconds since the crash, as each decision reaches the log)")
    out.go_live(crashed_at)
    stuck = list(killed())
    if not watcher.wait(settled(stuck), WAIT_S):
        raise DemoError(
            f"recovery did not decide every in-doubt step within {WAIT_S:g}s; "
            f"{_daemon_state(stack, 'recovery')}"
        )


def _resume(stack: LocalStack, out: _Narrator, watcher: LogWatcher, result: DemoResult) -> None:
    out.heading("4. A new agent process resumes the crashed trips")
    stuck = list(killed())
    run = _run_agent(stack, stuck, "resume")
    result.statuses.update(run.reports)
    if not watcher.wait_seen(run.acked, WAIT_S):
        raise DemoError(f"the resumed trips' events were not all read in {WAIT_S:g}s")
    for wf in stuck:
        out.say(f"{wf}: {run.reports.get(wf, 'no report (see agents.log)')}")


def _steps(stack: LocalStack, out: _Narrator, watcher: LogWatcher) -> list[dict[str, Any]]:
    out.heading("5. What the projector made of the log: the steps table")
    steps, keys = _query_fresh(stack, watcher)
    out.console.print(show.steps_table(steps))
    return to_records(keys)


def _query_fresh(stack: LocalStack, watcher: LogWatcher) -> tuple[QueryResult, QueryResult]:
    # The snapshot is fresh once it holds every event the watcher saw (and no more arrived).
    for _ in range(10):
        seen = watcher.events
        if not stack.wait_snapshot(seen, WAIT_S):
            raise DemoError(
                f"the projector's snapshot did not catch up within {WAIT_S:g}s; "
                f"{_daemon_state(stack, 'projector')}"
            )
        if watcher.events == seen:
            break
    snap = latest_snapshot(stack.db)
    assert snap is not None
    steps, keys = run_query(snap, f"{STEPS_SQL}; {KEYS_SQL}")
    return steps, keys


def _effects(
    stack: LocalStack, out: _Narrator, rows: list[dict[str, Any]], result: DemoResult
) -> None:
    result.effects = count_effects(stack.services, booking_keys(rows))
    out.console.print(show.effects_table(result.effects))
    result.ran_twice = result.effects.ran_twice()
    if result.ran_twice:
        out.say(f"SOMETHING RAN TWICE: {'; '.join(result.ran_twice)}")
        return
    counts = result.effects
    out.say(
        f"nothing ran twice: at most one charge, refund, booking, cancellation and email per "
        f"workflow ({counts.total('charge')} charges, {counts.total('refund')} refunds, "
        f"{counts.total('booking')} bookings, {counts.total('cancel')} cancellations, "
        f"{counts.total('email')} emails in all)"
    )
    result.left_standing = counts.left_standing(result.statuses)
    if result.left_standing:
        out.say(f"COMPENSATED BUT LEFT STANDING: {'; '.join(result.left_standing)}")
        return
    for wf, status in sorted(result.statuses.items()):
        if status == "compensated":
            c = counts.per_workflow.get(wf, {})
            out.say(
                f"{wf} ended compensated and nothing is left standing: charge "
                f"{c.get('charge', 0)}, refund {c.get('refund', 0)}, booking "
                f"{c.get('booking', 0)}, cancel {c.get('cancel', 0)} (the services' own counts)"
            )


def _escalations(stack: LocalStack, out: _Narrator, result: DemoResult) -> None:
    out.heading("6. Waiting for a human")
    result.escalations = read_queue(stack.settings, codec_for(stack.settings), max_time=30).open()
    if not result.escalations:
        out.say("no open escalations")
    connect = f" --bootstrap {stack.settings.bootstrap} --topic {stack.settings.topic}"
    if result.escalations:
        for line in show.answer_notes(local_broker=stack.broker is not None, keep=result.keep):
            out.say(line)
    for item in result.escalations:
        flag = "--happened"
        if item.tool == EMAIL:
            sent = result.effects.per_workflow.get(item.workflow_id, {}).get("email", 0)
            flag = "--happened" if sent else "--not-happened"
            out.say(
                f"the email service holds {sent} email(s) to {item.workflow_id}: "
                f"the answer is {flag}"
            )
        for line in show.escalation_lines(item, flag, connect):
            out.say(line)


def _cleanup_line(stack: LocalStack, out: _Narrator, result: DemoResult, keep: Path | None) -> None:
    out.heading("Cleanup")
    if result.left_running:
        left = ", ".join(f"{role} pid {pid}" for role, pid in result.left_running)
        out.say(f"STILL RUNNING: {left}")
    else:
        count = stack.started()
        out.say(
            f"stopped all {count} processes the demo started; none left running"
            if count
            else "the demo started no processes"
        )
    if keep is not None:
        out.say(f"logs, service state and DuckDB files kept in {keep}")


@dataclass(frozen=True)
class _AgentRun:
    pid: int
    code: int
    reports: dict[str, str]
    acked: set[str]
    """Every event id the broker acknowledged to the agent (its ack journal)."""


def _run_agent(stack: LocalStack, targets: list[str], name: str) -> _AgentRun:
    journal = stack.workdir / f"acks-{name}.txt"
    proc = stack.spawn(
        [*AGENT, *targets, "--db", str(stack.db), "--grace", "0.5"],
        env=stack.child_env(STEPLEDGER_ACK_JOURNAL=str(journal)),
        stderr=stack.workdir / "agents.log",
    )
    try:
        stdout, _ = proc.communicate(timeout=AGENT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise DemoError(f"the agent did not finish within {AGENT_TIMEOUT_S:g}s") from exc
    reports: dict[str, str] = {}
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            report = json.loads(line)
            reports[str(report["workflow"])] = str(report["status"])
    acked = set(journal.read_text().split()) if journal.exists() else set()
    return _AgentRun(proc.pid, proc.returncode, reports, acked)


def _daemon_state(stack: LocalStack, name: str) -> str:
    proc = stack.procs[name]
    state = (
        "running" if proc.alive else f"exited {proc.process.returncode if proc.process else '-'}"
    )
    return f"the {name} daemon is {state}; its log ends: {proc.log_tail(8)}"


def _tail(stack: LocalStack) -> str:
    path = stack.workdir / "agents.log"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return " | ".join(lines[-5:]) or "(agents.log is empty)"


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="stepledger-demo-") as tmp:
        yield Path(tmp)

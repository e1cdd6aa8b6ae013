"""The chaos run: real processes, real SIGKILLs at labelled crash points, then the invariants.

One run: a broker (a local one, on memory storage or with ``durable_broker`` on loopback S3
storage so it can be restarted gracefully; Apache Kafka with ``engine="kafka"``, whose
partition leaders are SIGKILLed and SIGSTOPped when it has three nodes; or yours with
``--bootstrap``), the
three example tool services, the projector and the recovery daemon as subprocesses, and
rounds of trip agents (quote -> charge -> book -> email), each agent process running a
batch of workflows and dying at each workflow's planned crash point (some resumed by an
agent that words the charge's memo and the email's body otherwise, as a model asked again
would: their recorded steps must be matched, never refused nor made again).  Between and during
rounds the harness kills the projector mid-batch and the recovery daemon mid-resolution,
SIGSTOPs the projector past its session timeout, and restarts the broker gracefully (or
kills a Kafka broker).
Then it waits for recovery to settle every in-doubt step, rebuilds the projection from
offset 0, and checks every invariant in ``invariants.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from stepledger.domain.state import StepStatus
from stepledger.errors import StepLedgerError
from stepledger.readers.lake import LakeConfig
from stepledger.readers.snapshots import shard_path
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger_dev.broker import LocalBroker
from stepledger_dev.chaos import evidence as gather
from stepledger_dev.chaos import lake_run
from stepledger_dev.chaos.cluster import ClusterFaults
from stepledger_dev.chaos.invariants import (
    Evidence,
    InvariantViolation,
    check_all,
    daemon_decisions,
    workflows_of,
)
from stepledger_dev.chaos.plan import AgentKill, ChaosPlan, CrashPoint, InfraFault, make_plan
from stepledger_dev.chaos.procs import Proc, wait_until
from stepledger_dev.examples.clients import RunningService
from stepledger_dev.examples.tools import BREAK_ENV
from stepledger_dev.examples.trip_agent import BUG
from stepledger_dev.stack import DaemonRole, Engine, LocalStack, StackOptions

AGENT = [sys.executable, "-m", "stepledger_dev.examples.trip_agent"]
STEP_IDS = ("quote", "charge", "book", "email")
AGENT_POINT = {
    CrashPoint.BEFORE_INTENT: "before_intent",
    CrashPoint.AFTER_INTENT: "after_intent",
    CrashPoint.AFTER_CALL: "after_effect",
    CrashPoint.AFTER_OUTCOME: "after_outcome",
    CrashPoint.RESUME_RACE: "after_effect",
    CrashPoint.FROZEN_AFTER_INTENT: "frozen_after_intent",
    CrashPoint.SECOND_RUNNER: "second_runner",
}
#: Partitions of the step log in a scaled run (several members per group).
SCALED_PARTITIONS = 8
ROLES: tuple[DaemonRole, ...] = ("projector", "recovery")
TERMINAL = {"completed", "compensated", "escalated", "dead_lettered"}
#: Seconds an agent process is given at least, and kept short of the run's budget.
AGENT_MIN_S, AGENT_MARGIN_S = 20.0, 30.0
#: Bounds of the wait for continued (frozen) runners to end.
THAW_MIN_S, THAW_MAX_S = 10.0, 120.0
SCALED_AGENT_GRACE_S = 3.0
#: How long the first deployment's end waits for the second's (same budget, started with it).
NEIGHBOUR_WAIT_S = 300.0


@dataclass(frozen=True)
class ChaosOptions:
    """What a run does; everything random is drawn from ``seed``."""

    workflows: int = 200
    seed: int = 1
    duration_s: float = 600.0
    bootstrap: str | None = None
    workdir: Path | None = None
    break_mode: str | None = None
    batch: int = 25
    parallel: int = 2
    max_attempts: int = 3
    tool_timeout_s: float = 1.0
    durable_broker: bool = False
    engine: Engine = "tansu"
    nodes: int = 1
    """Apache Kafka nodes; with 3 or more the plan SIGKILLs and SIGSTOPs brokers."""
    projectors: int = 1
    """Projector processes in one group (more than one: a shard directory)."""
    recoverers: int = 1
    """Recovery daemons in one group (their state on the recovery changelog topic)."""
    no_shared_state: bool = False
    """No shared volume at all (``--no-shared-state``): a shard directory per projector,
    a checkpointer, agents opening workflows from Kafka."""
    agent_skew_s: float = 0.0
    """Seconds the agents' wall clock is moved against the daemons' (one clock for deadlines)."""
    two_deployments: bool = False
    """A second deployment runs the same plan on the same cluster at the same time, named by
    its step log alone (:mod:`stepledger_dev.chaos.neighbour`)."""
    secure: bool = False
    """A secured Apache Kafka: each deployment a fleet, each process with its role's config."""
    lake: str = ""
    """The projectors commit to this DuckLake (its catalog DSN; the bucket's key from the
    environment) instead of shard directories (:mod:`stepledger_dev.chaos.lake_run`)."""
    lake_data_path: str = ""
    """Where the lake's data files go (``s3://bucket/prefix/``)."""
    rebuild_lake: str = ""
    """A fresh lake (its catalog DSN) the log is rebuilt into, to compare with the lake."""

    @property
    def scaled(self) -> bool:
        """Several members in a daemon's group: an 8-partition topic and the scale faults."""
        return self.projectors > 1 or self.recoverers > 1

    @property
    def scaled_roles(self) -> tuple[str, ...]:
        """The daemons with several members, whose scale faults the plan draws."""
        many = (("projector", self.projectors), ("recovery", self.recoverers))
        return tuple(role for role, members in many if members > 1)

    def lake_config(self, catalog: str, under: str = "") -> LakeConfig | None:
        """A lake of the run (None: no catalog given), its data under ``lake_data_path`` plus
        ``under`` (two lakes never share data files), the bucket's key from the environment."""
        if not catalog:
            return None
        path = self.lake_data_path
        return LakeConfig.from_env(catalog, f"{path.rstrip('/')}-{under}/" if under else path)


@dataclass
class RunResult:
    """What the run did and found."""

    plan: ChaosPlan
    violations: list[InvariantViolation]
    status: dict[str, str]
    infra_done: list[str] = field(default_factory=list)
    seconds: float = 0.0
    events: int = 0
    workdir: str = ""
    broker_faults: list[str] = field(default_factory=list)
    """What each broker fault did (which node, which partition it led)."""
    acked_in_broker_faults: int = 0
    """Acknowledged events written while a broker was down, stopped or catching up."""
    replays_from_zero: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per daemon role, partition -> times it was replayed from offset 0 (no state yet)."""
    members: dict[str, int] = field(default_factory=dict)
    """Per daemon role, processes started (restarts and additions included)."""
    decided_by_daemons: int = 0
    """Step attempts a recovery daemon decided (an outcome, a compensation, an abandonment)."""
    projector_replays_by_member: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per projector member, partition -> times it replayed it from offset 0."""
    lake_offsets: dict[int, int] = field(default_factory=dict)
    """With a lake: each partition's next offset in it at the end."""
    analyst_cuts: int = 0
    """With a lake: the analyst process's reads that found records (each one cut)."""
    topic: str = ""
    """The run's step log."""


class Run:
    """One chaos run's processes and state."""

    def __init__(self, options: ChaosOptions, stack: LocalStack) -> None:
        self.options, self.stack = options, stack
        self.workdir, self.settings = stack.workdir, stack.settings
        self.rng = random.Random(options.seed + 1)
        # Only a broker on durable storage may be restarted: a memory one would lose the log.
        self.broker: LocalBroker | None = stack.broker if options.durable_broker else None
        self.cluster: ClusterFaults | None = None
        if stack.kafka is not None and stack.kafka.nodes >= 3:
            self.cluster = ClusterFaults(
                stack.kafka, self.settings.topic, random.Random(options.seed)
            )
        self.fault_errors: list[str] = []
        self.problems: list[InvariantViolation] = []
        self.slow_runners: list[int] = []
        """Continued runners killed past the wait for them (their stacks are in agents.log)."""
        """What the run itself saw go wrong (a member not stopping cleanly, ...)."""
        self.acks: list[Path] = []
        self.frozen: list[subprocess.Popen[str]] = []
        """Agent processes stopped after an intent, continued after the next round."""
        self.infra_done: list[str] = []
        self.reworded: set[str] = set()
        """Workflows whose resumed attempts word their free-text arguments otherwise."""
        self.started = time.monotonic()
        self._members = threading.Lock()
        self.lake = options.lake_config(options.lake)
        self.analyst: Proc | None = None

    @property
    def procs(self) -> dict[str, Proc]:
        """The supervised daemons (projector, recovery)."""
        return self.stack.procs

    @property
    def services(self) -> dict[str, RunningService]:
        """The example tool services."""
        return self.stack.services

    @property
    def db(self) -> Path:
        """The live projection file."""
        return self.stack.db

    def left(self) -> float:
        """Seconds left in the run's time budget."""
        return self.options.duration_s - (time.monotonic() - self.started)

    # -- agents -----------------------------------------------------------------------------

    def run_round(
        self, round_no: int, targets: list[tuple[str, AgentKill | None]], faults: list[InfraFault]
    ) -> dict[str, str]:
        """Run one round of agent processes (in batches); return each workflow's status."""
        reports: dict[str, str] = {}
        pending = list(enumerate(_batches(targets, self.options.batch)))
        running: list[tuple[subprocess.Popen[str], list[str], float | None]] = []
        fault_threads = [self._fault_later(f) for f in faults]
        while pending or running:
            while pending and len(running) < self.options.parallel:
                index, (batch, race_grace) = pending.pop(0)
                proc, ids = self._spawn_agent(round_no, index, batch, grace=self._agent_grace())
                running.append((proc, ids, race_grace))
            for item in list(running):
                proc, ids, race_grace = item
                if proc.poll() is None and _stopped(proc.pid):
                    # Frozen after an intent: its workflows are resumed in the next round,
                    # and the process is continued once that round is over.
                    self.frozen.append(proc)
                    running.remove(item)
                    for wf in ids:
                        reports.setdefault(wf, "crashed")
                    continue
                if proc.poll() is None and self.left() > 0:
                    continue
                if proc.poll() is None:
                    proc.kill()
                out, _ = proc.communicate(timeout=30)
                with open(self.workdir / "agent-reports.jsonl", "a") as log:
                    log.write(out)
                reports.update(self._take_reports(out))
                running.remove(item)
                if race_grace is not None and self.left() > 0:
                    # Restarted at once: the resume and the daemon are due at about the same
                    # moment, and the log must hold one decision whoever comes first.
                    again: Batch = [(wf, None) for wf in ids]
                    index = 1000 + len(self.acks)
                    proc, ids = self._spawn_agent(round_no, index, again, grace=race_grace)
                    running.append((proc, ids, None))
                    continue
                for wf in ids:
                    reports.setdefault(wf, "crashed")
            time.sleep(0.05)
        for thread in fault_threads:
            thread.join(60)
        if round_no > 0:
            self.thaw_frozen()
        return reports

    def thaw_frozen(self) -> None:
        """Continue the runners frozen in earlier rounds; their workflows moved on without them.

        What they print is logged, not taken as the workflows' status: a continued runner
        must leave its step alone (the invariants count the effects).
        """
        for proc in self.frozen:
            os.kill(proc.pid, signal.SIGCONT)
        # All continued at once and waited for together: one bound for the lot, not one each.
        ends = time.monotonic() + max(THAW_MIN_S, min(THAW_MAX_S, self.left()))
        for proc in self.frozen:
            try:
                out, _ = proc.communicate(timeout=max(1.0, ends - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Slow, not wrong: what it did is judged by the effects the services count.
                # Its threads' stacks go to agents.log first, for whoever reads the run.
                os.kill(proc.pid, signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
                proc.kill()
                out, _ = proc.communicate(timeout=30)
                self.slow_runners.append(proc.pid)
            with open(self.workdir / "agent-reports-frozen.jsonl", "a") as log:
                log.write(out)
            self._take_reports(out)  # statuses: not the workflows' (they moved on)
        self.frozen.clear()

    def _take_reports(self, out: str) -> dict[str, str]:
        """Each workflow's status from an agent's report lines; a thread that raised outside
        the exception tree (any report, a superseded runner's too) is a violation, by name."""
        statuses: dict[str, str] = {}
        for line in out.splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                report = json.loads(line)
                if report.get("status") == BUG:
                    who = report.get("workflow") or report.get("superseded_runner")
                    detail = f"{who}: {report['error']}"
                    self.problems.append(InvariantViolation("agent_raised_a_bug", None, detail))
                if str(report.get("error", "")).startswith("PlanMismatchError"):
                    # The agents' plan never changes what identifies a call: a mismatch is
                    # a re-worded call not matched to its recorded step.
                    found = InvariantViolation(
                        "logical_call_matched", report.get("workflow"), str(report["error"])
                    )
                    if found not in self.problems:  # once, not once per round
                        self.problems.append(found)
                statuses[report["workflow"]] = report["status"]
        return statuses

    def _agent_grace(self) -> float:
        """Seconds a resuming agent waits past an in-doubt step's deadline before deciding it.

        Scaled runs give the daemons a head start: a partition's new owner re-anchors the
        deadlines it took over on its own clock, so with the agents' usual 0.5 s the resumed
        agents would decide every in-doubt step themselves and the daemons' single decision
        per step (what those runs check) would go unexercised.
        """
        return SCALED_AGENT_GRACE_S if self.options.scaled else 0.5

    def _spawn_agent(
        self,
        round_no: int,
        index: int,
        batch: list[tuple[str, AgentKill | None]],
        *,
        grace: float = 0.5,
    ) -> tuple[subprocess.Popen[str], list[str]]:
        journal = self.workdir / f"acks-r{round_no}-b{index}.txt"
        self.acks.append(journal)
        args = [_target(wf, kill) + ("+reword" * (wf in self.reworded)) for wf, kill in batch]
        db = self.stack.agent_db()
        where = [] if db is None else ["--db", str(db)]
        proc = self.stack.spawn(
            [
                *AGENT,
                *args,
                *where,
                "--grace",
                str(grace),
                # A hung agent says so (with every thread's stack in agents.log) before the
                # run's budget is gone, instead of being killed silently at its end.
                "--max-seconds",
                f"{max(AGENT_MIN_S, self.left() - AGENT_MARGIN_S):.0f}",
            ],
            env=self.stack.child_env(
                STEPLEDGER_ACK_JOURNAL=str(journal),
                STEPLEDGER_DEV_CLOCK_SKEW_S=str(self.options.agent_skew_s),
            ),
            stderr=self.workdir / "agents.log",
        )
        return proc, [wf for wf, _ in batch]

    # -- infrastructure faults ----------------------------------------------------------------

    def _fault_later(self, fault: InfraFault) -> threading.Thread:
        delay = self.rng.uniform(0.3, 2.5)
        thread = threading.Thread(target=self._fault, args=(fault, delay), daemon=True)
        thread.start()
        return thread

    def _fault(self, fault: InfraFault, delay: float) -> None:
        time.sleep(delay)  # a random moment inside the round: that is the fault's point
        try:
            self._inject(fault.point)
        except Exception as exc:  # reported as a violation: the fault did not happen as planned
            self.fault_errors.append(f"{fault.point.value}: {exc}")
            return
        self.infra_done.append(fault.point.value)

    def _inject(self, point: CrashPoint) -> None:
        if self.options.scaled:
            self._inject_scaled(point)
        elif point is CrashPoint.PROJECTOR_MID_BATCH:
            self.procs["projector"].kill()
            self.procs["projector"].start()
        elif point is CrashPoint.RECOVERY_MID_RESOLUTION:
            self.procs["recovery"].kill()
            self.procs["recovery"].start()
        elif point is CrashPoint.CONSUMER_STOP:
            projector = self.procs["projector"]
            projector.pause()
            time.sleep(7.0)  # past the consumer's 6 s session timeout: the group rebalances
            projector.resume()
        elif point is CrashPoint.BROKER_RESTART and self.broker is not None:
            self.broker.restart()
        elif point is CrashPoint.BROKER_LEADER_KILL and self.cluster is not None:
            self.cluster.kill_leader()
        elif point is CrashPoint.BROKER_STOP and self.cluster is not None:
            self.cluster.stop_broker()

    def _inject_scaled(self, point: CrashPoint) -> None:
        """A fault on one member of a group; a killed member is not restarted."""
        if point is CrashPoint.PROJECTOR_MID_BATCH:
            self._member("projector").kill()
        elif point is CrashPoint.RECOVERY_MID_RESOLUTION:
            self._member("recovery").kill()
        elif point in (CrashPoint.CONSUMER_STOP, CrashPoint.RECOVERY_STOP):
            member = self._member("projector" if point is CrashPoint.CONSUMER_STOP else "recovery")
            member.pause()
            time.sleep(7.0)  # past the members' 6 s session timeout: the group rebalances
            member.resume()
        elif point in (CrashPoint.PROJECTOR_ADDED, CrashPoint.RECOVERY_ADDED):
            with self._members:
                self.stack.add_daemon(
                    "projector" if point is CrashPoint.PROJECTOR_ADDED else "recovery"
                )

    def _member(self, role: DaemonRole) -> Proc:
        """A random live member of a group that keeps at least one other member."""
        with self._members:
            alive = [p for p in self.stack.daemons(role) if p.alive]
        if len(alive) < 2:
            raise RuntimeError(f"{len(alive)} {role} process(es) alive: none to spare")
        return self.rng.choice(alive)

    def wait_members_settled(self, timeout: float) -> bool:
        """Wait until every partition has a shard and a recovery checkpoint (scaled runs).

        Then every partition was replayed from offset 0 once already, and its state is
        there for whichever member takes it next.
        """
        topic, count = self.settings.topic, self.stack.options.partitions

        def ready() -> bool:
            if self.lake is not None:  # every partition's table set made by its first owner
                tables = len(lake_run.lake_offsets(self.lake, topic)) == count
                return tables and (
                    self.options.recoverers < 2
                    or all(self._checkpointed(topic, p) for p in range(count))
                )
            places = self.stack.projections()
            shards = self.options.projectors < 2 or all(
                any(shard_path(place, topic, p).exists() for place in places) for p in range(count)
            )
            saved = self.options.recoverers < 2 or all(
                self._checkpointed(topic, p) for p in range(count)
            )
            return shards and saved

        return wait_until(ready, timeout, interval=0.2)

    def _checkpointed(self, topic: str, partition: int) -> bool:
        store = KafkaCheckpointStore(self.settings, self.settings.recovery_group)
        try:
            return store.load(topic, partition) is not None
        except StepLedgerError:
            return False  # the changelog is created by the first daemon
        finally:
            store.close()

    # -- the end ------------------------------------------------------------------------------

    def settle(self, timeout: float) -> None:
        """Wait until recovery decided every in-doubt step (bounded)."""

        def settled() -> bool:
            events, _ = gather.read_log(self.settings)
            return not any(
                s.status in (StepStatus.INTENDED, StepStatus.COMPENSATING)
                for wf in workflows_of(events).values()
                for s in wf.steps.values()
            )

        wait_until(settled, timeout, interval=1.0)

    def stop_projector_caught_up(self, timeout: float) -> None:
        """Let the projector catch up with the log, then stop it gracefully."""
        events, _ = gather.read_log(self.settings)
        target = len({e.event_id for e in events})

        self.stack.wait_snapshot(target, timeout)
        for projector in self.stack.daemons("projector"):
            if not projector.alive:
                continue  # killed by the plan
            code = projector.stop()
            if code != 0:
                detail = f"{projector.name} exited {code} on SIGTERM"
                self.problems.append(InvariantViolation("daemons_stop_cleanly", None, detail))

    def evidence(self) -> Evidence:
        """Gather everything the invariants need."""
        from stepledger.projector.rebuild import rebuild

        events, bad = gather.read_log(self.settings)
        fresh = self.options.lake_config(self.options.rebuild_lake, "rebuild")
        if self.lake is not None and fresh is not None:
            live, rebuilt = lake_run.lake_evidence(self.settings, self.lake, fresh)
            diff = gather.projection_diff(live, rebuilt)
        else:
            rebuilt_file = self.workdir / "rebuild.duckdb"
            rebuild(self.settings, rebuilt_file, force=True)
            diff = gather.projection_diff(self._live(), rebuilt_file)
        effects: dict[str, dict[str, int]] = {}
        for name in ("payments", "bookings"):
            effects.update(gather.effect_counts(self.services[name].state_path))
        return Evidence(
            events=events,
            acked_event_ids=gather.read_acks(self.acks),
            effects=effects,
            charges_by_workflow=gather.records_by(
                self.services["payments"].state_path, "charge", "customer"
            ),
            emails_by_workflow=gather.records_by(
                self.services["email"].state_path, "email", "to", gather.email_workflow
            ),
            captured_by_workflow=gather.standing_records(
                self.services["payments"].state_path, "charge", "customer", "captured"
            ),
            confirmed_bookings=gather.standing_records(
                self.services["bookings"].state_path, "booking", "idempotency_key", "confirmed"
            ),
            projection_diff=diff,
            undecodable=bad,
            replays_from_zero=self.replays_from_zero(),
            partitions=self.stack.options.partitions if self.options.scaled else 0,
            recovery_producers=frozenset(
                f"{socket.gethostname()}:{pid}"
                for member in self.stack.daemons("recovery")
                for pid in member.pids
            ),
            no_shared_state=self.options.no_shared_state,
            projector_replays_by_member=self.projector_replays_by_member(),
            lake=self.lake is not None,
        )

    def _live(self) -> Path | list[Path]:
        """The live projection: one path, or every member's own shard directory."""
        return self.stack.projections() if self.options.no_shared_state else self.db

    def projector_replays_by_member(self) -> dict[str, dict[int, int]]:
        """Per projector member, how often it replayed each partition from offset 0."""
        logs = [p.log_path for p in self.stack.daemons("projector")]
        return gather.replays_by_member(logs, "projector", self.settings.topic)

    def replays_from_zero(self) -> dict[str, dict[int, int]]:
        """Per role, how often each partition was replayed from offset 0 (from the logs)."""
        logs: dict[str, list[Path]] = {
            role: [p.log_path for p in self.stack.daemons(role)] for role in ROLES
        }
        return gather.replays_from_zero(logs, self.settings.topic)


def run_chaos(options: ChaosOptions, echo: Callable[[str], None] = print) -> RunResult:
    """Run the whole harness and return its result (the caller prints and exits)."""
    plan = make_plan(
        options.workflows,
        options.seed,
        steps=len(STEP_IDS),
        max_attempts=options.max_attempts,
        broker_restarts=options.durable_broker and not options.bootstrap,
        broker_kills=options.engine == "kafka" and options.nodes >= 3 and not options.bootstrap,
        scaled=options.scaled,
        scaled_roles=options.scaled_roles,
    )
    stack_options = StackOptions(
        bootstrap=options.bootstrap,
        durable_broker=options.durable_broker,
        engine=options.engine,
        nodes=options.nodes,
        topic_prefix=f"chaos-{options.seed}",
        fleet_id="chaos",
        tool_timeout_s=options.tool_timeout_s,
        max_attempts=options.max_attempts,
        env=((BREAK_ENV, options.break_mode),) if options.break_mode else (),
        partitions=SCALED_PARTITIONS if options.scaled else 3,
        projectors=options.projectors,
        recoverers=options.recoverers,
        no_shared_state=options.no_shared_state,
        secure=options.secure,
        lake=options.lake_config(options.lake),
    )
    with _workdir(options) as workdir, LocalStack(workdir, stack_options) as stack:
        if options.two_deployments:
            return _beside(options, stack, plan, echo)
        return _execute(Run(options, stack), plan, echo)


def _beside(
    options: ChaosOptions, stack: LocalStack, plan: ChaosPlan, echo: Callable[[str], None]
) -> RunResult:
    """The run, with a second deployment running the same plan beside it (one cluster)."""
    from stepledger_dev.chaos import neighbour

    bootstrap = stack.settings.bootstrap
    second = replace(options, two_deployments=False, bootstrap=bootstrap, durable_broker=False)

    def lines(line: str) -> None:
        echo(f"neighbour: {line}")

    def execute(other: LocalStack) -> list[InvariantViolation]:
        return _execute(Run(second, other), neighbour.same_plan(plan), lines).violations

    shared = stack.settings if options.break_mode == neighbour.SHARED_STATE_BREAK else None
    options_b = neighbour.neighbour_stack_options(
        stack.options, bootstrap, shared, admin=stack.settings.kafka
    )
    beside = neighbour.Beside(stack.workdir / "neighbour", options_b, execute, echo)
    try:
        beside.start()
        result = _execute(Run(options, stack), plan, echo)
        result.violations += beside.finish(timeout=NEIGHBOUR_WAIT_S)
        result.violations += neighbour.isolation(stack, beside.stack)
        result.infra_done.append(CrashPoint.SECOND_DEPLOYMENT.value)
    finally:
        beside.stop()
    return result


def _execute(run: Run, plan: ChaosPlan, echo: Callable[[str], None]) -> RunResult:
    run.reworded = {w.workflow_id for w in plan.workflows if w.reword}
    run.stack.start_daemons()
    if run.lake is not None:
        run.analyst = lake_run.start_analyst(run.stack, run.lake)
    if run.options.scaled and not run.wait_members_settled(timeout=min(90.0, run.left())):
        detail = "not every partition had a shard and a recovery checkpoint in time"
        run.problems.append(InvariantViolation("members_settled", None, detail))
    status: dict[str, str] = {}
    faults = list(plan.infra)
    rounds = max(len(w.kills) for w in plan.workflows) + 2
    for round_no in range(rounds):
        targets = [
            (w.workflow_id, w.kills[round_no] if round_no < len(w.kills) else None)
            for w in plan.workflows
            if status.get(w.workflow_id) not in TERMINAL
        ]
        if not targets or run.left() <= 0:
            break
        due = [f for f in faults if f.round <= round_no]
        faults = [f for f in faults if f not in due]
        echo(
            f"round {round_no + 1}: {len(targets)} workflows, faults: "
            f"{', '.join(f.point.value for f in due) or 'none'}"
        )
        status.update(run.run_round(round_no, targets, due))
    run.thaw_frozen()
    if run.slow_runners:
        pids = ", ".join(map(str, run.slow_runners))
        echo(f"slow: continued runner(s) {pids} killed after the wait; stacks in agents.log")
    run.settle(timeout=max(10.0, min(90.0, run.left())))
    run.stop_projector_caught_up(timeout=60.0)
    cuts: list[dict[str, object]] = []
    if run.analyst is not None:
        run.analyst.stop()
        cuts = lake_run.analyst_cuts(run.stack)
    found = run.evidence()
    violations = check_all(found)
    if run.lake is not None:
        violations += lake_run.analyst_violations(cuts)
    violations += [InvariantViolation("infra_fault_injected", None, e) for e in run.fault_errors]
    violations += run.problems
    if run.left() <= 0:
        violations.append(
            InvariantViolation("finished_within_duration", None, "time budget exhausted")
        )
    return RunResult(
        plan,
        violations,
        status,
        run.infra_done,
        time.monotonic() - run.started,
        len(found.events),
        str(run.workdir),
        list(run.cluster.done) if run.cluster else [],
        run.cluster.acked_during(found.events, found.acked_event_ids) if run.cluster else 0,
        {k: dict(v) for k, v in found.replays_from_zero.items()},
        {role: sum(p.starts for p in run.stack.daemons(role)) for role in ROLES},
        len(daemon_decisions(found.events, found.recovery_producers)),
        {k: dict(v) for k, v in found.projector_replays_by_member.items()},
        lake_run.lake_offsets(run.lake, run.settings.topic) if run.lake else {},
        sum(1 for cut in cuts if cut.get("records")),
        run.settings.topic,
    )


Batch = list[tuple[str, AgentKill | None]]


def _batches(targets: Batch, size: int) -> list[tuple[Batch, float | None]]:
    """Agent batches; a resume race gets batches of its own, one grace each.

    A batch dies with its first kill, so racing workflows are not mixed with others: the
    whole batch is restarted at once with the race's grace.
    """
    races: dict[float, Batch] = {}
    plain: Batch = []
    frozen: Batch = []
    for wf, kill in targets:
        if kill is not None and kill.point is CrashPoint.RESUME_RACE:
            races.setdefault(kill.grace_s, []).append((wf, kill))
        elif kill is not None and kill.point is CrashPoint.FROZEN_AFTER_INTENT:
            frozen.append((wf, kill))  # a process that stops, not one that dies
        else:
            plain.append((wf, kill))
    found: list[tuple[Batch, float | None]] = [
        (plain[i : i + size], None) for i in range(0, len(plain), size)
    ]
    found += [(frozen[i : i + size], None) for i in range(0, len(frozen), size)]
    for grace, group in sorted(races.items()):
        found += [(group[i : i + size], grace) for i in range(0, len(group), size)]
    return found


def _target(workflow_id: str, kill: AgentKill | None) -> str:
    if kill is None:
        return workflow_id
    return f"{workflow_id}@{STEP_IDS[kill.step]}:{AGENT_POINT[kill.point]}"


def _stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP), per /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["T"]


@contextlib.contextmanager
def _workdir(options: ChaosOptions) -> Iterator[Path]:
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        yield options.workdir
        return
    with tempfile.TemporaryDirectory(prefix="stepledger-chaos-") as tmp:
        yield Path(tmp)

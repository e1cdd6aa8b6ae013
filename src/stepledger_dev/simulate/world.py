"""One run: a plan's actors on one scheduler, its faults applied, every turn checked.

The run has two phases.  For ``plan.turns`` turns the faults fire at their turns and the
seed picks who runs; then every frozen actor thaws, no fault fires any more, and the run
goes on until every agent process ended and the daemons had ``SETTLE_MS`` of simulated time
to decide what is left (bounded by ``4 * plan.turns`` turns in all).  The invariants are
checked after every turn; the liveness one (``decided_within_bound``) once, at the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.producer import Ledger, ResumeOptions, Workflow
from stepledger_dev.simulate import agents, checkpointing, daemons, liveness, statetopic
from stepledger_dev.simulate import services as sv
from stepledger_dev.simulate.invariants import Violation
from stepledger_dev.simulate.plan import (
    AFTER_OUTCOME,
    AGENT_KINDS,
    GRACE_S,
    LOG_FAULTS,
    ActorSpec,
    Fault,
    Plan,
)
from stepledger_dev.simulate.scheduler import TURN_MS, Actor, ActorState, SimTimer
from stepledger_dev.simulate.simlog import LogClient, Record
from stepledger_dev.simulate.stage import Stage

#: Simulated time the daemons get after the last agent ended, before the run is judged.
SETTLE_MS = 6_000


@dataclass
class Outcome:
    """What a run found: violations (empty: none), its trace, how each actor ended."""

    plan: Plan
    violations: list[Violation]
    trace: list[str]
    turns: int
    ms: int
    ended: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """True when an invariant was broken."""
        return bool(self.violations)


class World:
    """One run: it builds the stage, starts and kills its actors, applies the faults."""

    def __init__(self, plan: Plan) -> None:
        stage = self.stage = Stage(plan)
        # The stage's parts the run drives (the same objects; the actors take the stage).
        self.plan, self.sched, self.broker = plan, stage.sched, stage.broker
        self.services, self.acks, self.monitor = stage.services, stage.acks, stage.monitor
        self.trace: list[str] = []
        self.down: list[list[int]] = []
        """Intervals (ms) when no recovery daemon ran: the liveness bound stretches by them."""
        self.takeovers: list[int] = []
        """When a restarted recovery daemon started (ms): it takes its partitions over from
        its checkpoint, and the liveness bound allows one more timeout from there."""
        self._current: dict[str, Actor] = {}
        """The newest process of each planned actor (a killed one's successor)."""
        self._spawns: list[tuple[int, ActorSpec]] = []
        self._generations: Counter[str] = Counter()
        self._effects = 0
        self._quiet_since: int | None = None
        self.broker.on_append.append(self._appended)

    # -- actors --------------------------------------------------------------------------

    def spawn(self, spec: ActorSpec, skew_ms: int = 0) -> Actor:
        """Start a process of a planned actor (a successor gets a new name)."""
        self._generations[spec.name] += 1
        n = self._generations[spec.name]
        name = spec.name if n == 1 else f"{spec.name}.{n}"
        actor = self.sched.add(Actor(name, spec.kind, self._body(spec)))
        actor.set_skew(self.sched.now_ms, skew_ms)
        self._current[spec.name] = actor
        if spec.kind in AGENT_KINDS:
            self.monitor.agents.add(name)
        self._note(name, f"starts ({spec.kind} {spec.workflow} {' '.join(spec.options)})".strip())
        if spec.kind == "recovery" and self.down and self.down[-1][1] < 0:
            self.down[-1][1] = self.sched.now_ms
            self.takeovers.append(self.sched.now_ms)
        return actor

    def _body(self, spec: ActorSpec) -> Callable[[Actor], None]:
        if spec.kind in AGENT_KINDS:
            return lambda actor: agents.run_agent(actor, spec, self.ledger_for(actor), self.sched)
        run = {
            "recovery": daemons.recovery,
            "projector": daemons.projector,
            "checkpointer": checkpointing.checkpointer,
            "other": checkpointing.other,
        }.get(spec.kind)
        return lambda actor: (run or daemons.people)(self.stage, actor)

    def ledger_for(self, actor: Actor) -> Ledger:
        """One agent process's ledger: its log client, reader, clocks and tools."""
        sched = self.sched
        return Ledger(
            self.stage.settings_for(actor),
            log=LogClient(self.broker, actor, self.acks),
            clock=lambda: sched.wall(actor),
            tools=sv.tools(self.services, actor),
            reader=self.stage.reader(actor),
            dead_letters=MemoryEventLetters(),
            options=ResumeOptions(grace_s=GRACE_S, resolve_timeout_s=5.0),
            timer=SimTimer(sched, actor),
            hooks=daemons.InlineHooks(),
        )

    # -- faults --------------------------------------------------------------------------

    def apply(self, fault: Fault) -> None:
        """Inject one fault (a target that is not running takes nothing)."""
        kind, value = fault.kind, fault.value
        if kind in LOG_FAULTS:
            self._log_fault(fault)
            return
        actor = self._current.get(fault.target)
        if actor is None or not actor.live:
            return
        self._note(actor.name, f"FAULT {kind} {value or ''}".strip())
        if kind == "freeze":
            actor.state, actor.thaw_ms = ActorState.FROZEN, self.sched.now_ms + value
            if actor.kind == "recovery":
                self.down.append([self.sched.now_ms, actor.thaw_ms])
        elif kind == "kill":
            self.sched.kill(actor)
            spec = next(a for a in self.plan.actors if a.name == fault.target)
            self._spawns.append((self.sched.now_ms + value, spec))
            if actor.kind == "recovery":
                self.down.append([self.sched.now_ms, -1])
        elif kind == "skew":
            fleet = self.plan.agent_skew_ms if actor.kind in AGENT_KINDS else 0
            actor.set_skew(self.sched.now_ms, value + fleet)
        elif kind.startswith("ack_"):
            self.acks.add(actor.name, kind.removeprefix("ack_"))
        elif kind.startswith("call_"):
            self.services.faults.setdefault(actor.name, []).append(kind.removeprefix("call_"))

    def _log_fault(self, fault: Fault) -> None:
        records = self.broker.workflow_records(fault.target)
        self._note("broker", f"FAULT {fault.kind} {fault.target}")
        if fault.kind == "retention":
            start = checkpointing.retention(self.stage, fault.target)
            number = self.broker.partition_of(fault.target)
            self._note("broker", f"p{number} now starts at {start}")
        elif fault.kind == "foreign":
            self.broker.put(fault.target.encode(), b"\x00not an event", [], None, "foreign")
        elif records:
            last = records[-1]
            self.broker.put(
                last.key, last.value, last.headers, last.event, "broker", duplicate=True
            )

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Run the plan to its end (or its first violation)."""
        try:
            self._loop()
            # Liveness needs someone to decide: a plan without a recovery daemon has nobody.
            deciders = any(a.kind == "recovery" for a in self.plan.actors)
            if not self.monitor.found and deciders:
                found = liveness.check(self.broker, self.down, self.sched.now_ms, self.takeovers)
                self.monitor.found.extend(found)
        finally:
            self.sched.close()
        ended = {a.name: a.ended for a in self.sched.actors.values()}
        return Outcome(
            self.plan,
            list(self.monitor.found),
            self.trace,
            self.sched.turns,
            self.sched.now_ms,
            ended,
        )

    def _loop(self) -> None:
        sched, plan = self.sched, self.plan
        faults = list(plan.faults)
        late = sorted((a for a in plan.actors if a.start > 0), key=lambda a: a.start)
        for spec in plan.actors:
            if spec.start <= 0:
                self.spawn(spec, self._skew_of(spec))
        healed_at: int | None = None
        while sched.turns < 4 * plan.turns:
            turn = sched.turns
            if healed_at is None:
                for fault in [f for f in faults if self._due(f, turn)]:
                    faults.remove(fault)
                    self.apply(fault)
                while late and late[0].start <= turn:
                    spec = late.pop(0)
                    self.spawn(spec, self._skew_of(spec))
                if turn >= plan.turns:
                    healed_at = self._heal()
            self._spawn_due()
            if healed_at is not None and self._settled():
                return
            ready = sched.ready()
            if not ready:
                if not self._idle(faults, late, healed_at):
                    return
                continue
            actor = ready[sched.rng.randrange(len(ready))]
            sched.now_ms += sched.rng.choice(TURN_MS)
            sched.run_turn(actor)
            if self._checked(actor):
                return

    def _due(self, fault: Fault, turn: int) -> bool:
        """True when a fault fires now: the log's at its turn, an actor's at its crossing."""
        if fault.kind in LOG_FAULTS:
            return fault.at <= turn
        actor = self._current.get(fault.target)
        if actor is None:
            return False
        if fault.at <= -AFTER_OUTCOME:
            return actor.outcomes >= -fault.at - AFTER_OUTCOME
        return actor.intents >= -fault.at if fault.at < 0 else actor.crossings >= fault.at

    def _idle(self, faults: list[Fault], late: list[ActorSpec], healed_at: int | None) -> bool:
        """Nobody can run: move time to the next waker; False when nothing will ever run."""
        wakes = [w for w in (self.sched.next_wake(), self._next_spawn()) if w is not None]
        if wakes:
            self.sched.now_ms = max(self.sched.now_ms, min(wakes))
            return True
        if healed_at is None and (faults or late):
            self.sched.turns += 1  # let the next fault or late start come
            return True
        return False

    def _heal(self) -> int:
        for actor in self.sched.actors.values():
            if actor.state is ActorState.FROZEN:
                actor.thaw_ms = self.sched.now_ms
        for interval in self.down:
            if interval[1] > self.sched.now_ms:
                interval[1] = self.sched.now_ms
        self._note("scheduler", "faults end")
        return self.sched.now_ms

    def _settled(self) -> bool:
        agents_live = any(a.live for a in self.sched.actors.values() if a.kind in AGENT_KINDS)
        if agents_live or self._spawns:
            self._quiet_since = None
            return False
        since = self._quiet_since
        if since is None:
            self._quiet_since = self.sched.now_ms
            return False
        return self.sched.now_ms - since >= SETTLE_MS

    def _skew_of(self, spec: ActorSpec) -> int:
        """A new process's clock: an agent's runs with the fleet's, a daemon's with the broker's."""
        return self.plan.agent_skew_ms if spec.kind in AGENT_KINDS else 0

    def _next_spawn(self) -> int | None:
        return min((ms for ms, _ in self._spawns), default=None)

    def _spawn_due(self) -> None:
        due = [(ms, spec) for ms, spec in self._spawns if ms <= self.sched.now_ms]
        for item in due:
            self._spawns.remove(item)
            before = self._current.get(item[1].name)
            skew = self._skew_of(item[1]) if before is None else before.skew_ms
            self.spawn(item[1], skew_ms=skew)

    def _checked(self, actor: Actor) -> bool:
        """Trace and check what the turn did; True once a violation was found."""
        for effect in self.services.effects[self._effects :]:
            self._note(effect.actor, f"EFFECT {effect.kind} {effect.ref} key={effect.key[:8]}")
        self._effects = len(self.services.effects)
        self.monitor.after_turn()
        wf = actor.notes.get("workflow")
        if isinstance(wf, Workflow):
            self.monitor.check_handle(wf.workflow_id, wf.state.seen)
        if actor.crash:
            where = wf.workflow_id if isinstance(wf, Workflow) else ""
            self.monitor._add("no_crash", where, f"{actor.name}: {actor.crash.splitlines()[-1]}")
            self.trace.append(actor.crash)
        if not actor.live and actor.ended:
            self._note(actor.name, f"ends: {actor.ended[:160]}")
        return bool(self.monitor.found)

    # -- tracing -------------------------------------------------------------------------

    def _appended(self, record: Record) -> None:
        event = record.event
        if event is None:
            self._note(record.writer, f"append <foreign bytes> p{record.partition}@{record.offset}")
            return
        body = event.body
        if isinstance(body, ev.ApprovalRequested) and event.step_id is not None:
            # The person approving a request sees the call its agent was making.
            writer = self.sched.actors.get(record.writer)
            calling = None if writer is None else writer.notes.get("calling")
            if isinstance(calling, dict):
                self.monitor.shown[event.event_id] = calling
        dup = " (duplicate)" if record.duplicate else ""
        self._note(
            record.writer,
            f"{event.type} {event.workflow_id}/{event.step_id or '-'}{_detail(body)} "
            f"p{record.partition}@{record.offset}{dup}",
        )

    def _note(self, who: str, what: str) -> None:
        self.trace.append(f"{self.sched.now_ms:>7}ms {who:<10} {what}")


def _detail(body: ev.Body) -> str:
    if isinstance(body, ev.WorkflowStarted | ev.WorkflowResumed):
        return f" attempt {body.attempt}"
    if isinstance(body, ev.StepIntended):
        return f" {body.tool} attempt {body.attempt} epoch {body.epoch}"
    if isinstance(body, ev.StepOutcome):
        return f" {body.status.value} by {body.source.value} attempt {body.attempt}"
    if isinstance(body, ev.CompensationIntended | ev.StepAbandoned):
        return f" by {body.source.value}"
    if isinstance(body, ev.WorkflowFinished):
        return f" {body.status.value}"
    if isinstance(body, ev.EscalationResolved):
        return f" {body.verdict.value}"
    if isinstance(body, ev.ApprovalDecided):
        return f" granted={body.granted} request {body.request}"
    return ""


def run(plan: Plan) -> Outcome:
    """Run one plan (with its seed) and return what it found."""
    from stepledger_dev.simulate import defects

    world = World(plan)
    clients = statetopic.clients(world.stage.state_topics)
    with defects.switched(plan.defects), agents.runner_names(world.sched), clients:
        return world.run()

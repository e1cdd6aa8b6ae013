"""The recovery daemon, the projector's fold and the people answering the queue, as actors.

**Recovery** is the real :class:`~stepledger.recovery.daemon.RecoveryDaemon` with its
consumer, thread pool and hook threads replaced: the actor reads the partitions itself (one
record per crossing, as a poll hands them over) and feeds them to the daemon's own
``_handle`` (tracker fold, each event's arrival on the daemon's clock from the broker's
timestamps, late outcomes),
checkpoints through its own ``checkpoint`` into a store that outlives the process, and
dispatches through its own ``_dispatch``: the tracker's due-time rule picks the steps and
the Resolver decides them.  A resolution runs on the actor's turn (:class:`InlineWork`),
its hooks run inline (:class:`InlineHooks`), a compensation's claim is read back from the
log (the same answer the daemon's claim board gives once its loop read the claim; "unknown"
for a workflow whose claims the tracker does not vouch for, as the board's), and the
ownership fence measures time on the simulated clock.

**The projector** folds every record it reads through the projector's own
:class:`~stepledger.projector.fold.BatchFold` into per-workflow projections and builds the
batch's rows; a killed projector rebuilds from the start of the log (after retention, from
the records still held: the projector's restore of a gap from checkpoints is not simulated).

**People** look at the human queue every few hundred milliseconds: an open escalation is
answered by checking the service (happened or not), a pending approval is granted; both
through the CLI's own :class:`~stepledger.humanqueue.answers.Answerer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from typing import Any

from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, WorkflowState, replay
from stepledger.errors import StepLedgerError
from stepledger.humanqueue.answers import Answerer
from stepledger.humanqueue.escalations import EscalationQueue, OpenEscalation
from stepledger.kafka import Position
from stepledger.kafka.fence import Fence
from stepledger.projector.fold import BatchFold
from stepledger.projector.projection import WorkflowProjection
from stepledger.recovery.daemon import CHECKPOINT_AFTER_CHANGES, RecoveryDaemon
from stepledger.recovery.fence import FencedLog
from stepledger.recovery.options import DaemonOptions
from stepledger.recovery.tracker import StepKey, Tracked
from stepledger.resolution.claims import ClaimCheck, reader_check
from stepledger.resolution.hooks import HookPool
from stepledger.resolution.resolver import Resolution
from stepledger_dev.simulate import services as sv
from stepledger_dev.simulate.plan import GRACE_S
from stepledger_dev.simulate.scheduler import Actor, Killed, SimTimer
from stepledger_dev.simulate.simlog import LogClient, SimReader
from stepledger_dev.simulate.stage import Stage

#: How often the daemon checkpoints while events flow (simulated milliseconds).
CHECKPOINT_MS = 500
#: How long an idle daemon or projector sleeps (simulated seconds).
IDLE_S = 0.05
#: How often people look at the queue (simulated seconds).
PEOPLE_EVERY_S = 0.4


class InlineHooks(HookPool):
    """Runs a hook on the caller's turn: the simulation has no threads of its own."""

    def __init__(self) -> None:
        super().__init__(size=0)

    def call(
        self, hook: Callable[..., Any], args: tuple[Any, ...], timeout: float, name: str
    ) -> Any:
        """Call the hook now (a simulated service answers in no real time)."""
        answer = hook(*args)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_awaited(answer))
        return answer


async def _awaited(answer: Any) -> Any:
    return await answer


class InlineWork:
    """The daemon's work pool, run on the loop's turn: one resolution at a time."""

    def __init__(self) -> None:
        self.inflight: dict[Future[Resolution], tuple[StepKey, int]] = {}
        self._done: list[tuple[StepKey, Future[Resolution]]] = []
        self._reads: list[tuple[StepKey, Future[Any], Callable[[StepKey, Future[Any]], None]]] = []
        self.free = 8

    def on(self, partitions: set[int]) -> bool:
        """Nothing runs between turns."""
        return False

    def submit(self, key: StepKey, tracked: Tracked, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(workflow_id, *args)`` to its end now."""
        tracked.busy = True
        future: Future[Resolution] = Future()
        try:
            done = fn(key[0], *args)
            future.set_result(done if isinstance(done, Resolution) else done())
        except Killed:
            raise
        except Exception as exc:  # the daemon's _finished judges it, as for a worker's
            future.set_exception(exc)
        self._done.append((key, future))

    def read(
        self,
        key: StepKey,
        partition: int,
        finished: Callable[[StepKey, Future[Any]], None],
        fn: Callable[..., Any],
        *args: Any,
    ) -> None:
        """Run a read (a reopened step's workflow) now; ``finished`` takes it at collect."""
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args))
        except Killed:
            raise
        except Exception as exc:
            future.set_exception(exc)
        self._reads.append((key, future, finished))

    def collect(self, finished: Callable[[StepKey, Future[Resolution]], None], **_: Any) -> None:
        """Hand every finished resolution (and read) to the daemon."""
        done, self._done = self._done, []
        for key, future in done:
            finished(key, future)
        reads, self._reads = self._reads, []
        for key, read, handler in reads:
            handler(key, read)

    def cancel(self, partitions: set[int]) -> None:
        """Nothing is queued."""

    def shutdown(self, *, wait: bool = False) -> None:
        """Nothing to stop."""


def recovery(stage: Stage, actor: Actor) -> None:
    """The recovery daemon's loop over every partition, from its stored checkpoint."""
    sched, broker = stage.sched, stage.broker
    settings = stage.settings_for(actor)
    options = DaemonOptions(
        state_dir=_state_dir(), grace_s=GRACE_S, checkpoint_interval_s=CHECKPOINT_MS / 1000
    )
    daemon = RecoveryDaemon(
        settings,
        sv.tools(stage.services, actor),
        options,
        log=LogClient(broker, actor, stage.acks),
        store=stage.recovery_store,
        dead_letters=MemoryEventLetters(),
        clock=lambda: sched.wall(actor),
        reader=SimReader(broker, actor),  # held steps' workflows, read over the broker
        timer=SimTimer(sched, actor),  # its due times run on simulated monotonic time
    )
    daemon.work = InlineWork()  # type: ignore[assignment]
    daemon.fence = Fence(options.session_timeout_s, 0.5, clock=lambda: sched.now_ms / 1000)
    resolver = daemon.resolver
    resolver.log = FencedLog(daemon.log, daemon.fence)
    resolver.hooks = InlineHooks()
    history = stage.reader(actor)
    resolver.confirm = _claim_check(
        daemon, reader_check(lambda workflow_id: history.read(workflow_id).events)
    )
    resolver.claimant = actor.name
    stage.daemon = daemon
    positions = _assign(daemon, stage)
    last_checkpoint = -CHECKPOINT_MS
    while True:
        daemon.fence.polled()
        read = False
        for number, part in enumerate(broker.partitions):
            at = max(positions[number], part.start)
            if at < part.end:
                sched.point(actor)
                daemon._handle(part.records[at].consumed())
                positions[number] = at + 1
                read = True
            if positions[number] >= part.end:
                daemon.caught_up.add(number)
        daemon._collect()
        if (
            sched.now_ms - last_checkpoint >= CHECKPOINT_MS
            or daemon.tracker.changed >= CHECKPOINT_AFTER_CHANGES
        ):
            daemon.checkpoint()
            last_checkpoint = sched.now_ms
        daemon._dispatch()
        if not read:
            sched.sleep(actor, _idle(daemon.tracker.next_due(), sched.broker_now()))


def _claim_check(daemon: RecoveryDaemon, read: ClaimCheck) -> ClaimCheck:
    """The daemon's claim board as the log answers it: a claim of a workflow whose claims
    the tracker does not vouch for is held when the loop reads it, and the board answers
    "unknown" (the claim is judged once its workflow is read back)."""

    def check(claim: ev.Event, position: Position) -> WorkflowState | None:
        if not daemon.tracker.vouches_claims(claim.workflow_id, position.partition):
            return None
        return read(claim, position)

    return check


def _assign(daemon: RecoveryDaemon, stage: Stage) -> dict[int, int]:
    """Take every partition over from its checkpoint (what ``_on_assign`` does)."""
    positions: dict[int, int] = {}
    topic = stage.broker.topic
    numbers = set(range(len(stage.broker.partitions)))
    for number in sorted(numbers):
        # The loaded steps count as arrived at the take-over, on the daemon's steady clock
        # (one clock: a checkpoint keeps no arrival times), as ``_on_assign`` does.
        checkpoint = daemon.store.load(topic, number)
        offset = daemon.tracker.load(number, checkpoint, daemon.steady())
        start = stage.broker.partitions[number].start
        positions[number] = max(offset or 0, start)
        if start > (offset or 0):
            daemon.tracker.skipped(number)  # its head was deleted unread, as _on_assign says
        daemon.caught_up.discard(number)
    for late in daemon.tracker.late:
        daemon.pending_late[late.event.event_id] = late
    daemon.tracker.late.clear()
    daemon.assigned |= numbers
    daemon.fence.assigned(numbers)
    return positions


def _idle(upcoming: datetime | None, now: datetime) -> float:
    if upcoming is None:
        return IDLE_S
    return min(IDLE_S, max(0.001, (upcoming - now).total_seconds()))


_STATE_DIR: Path | None = None


def _state_dir() -> Path:
    # The daemon wants a directory for its health file; nothing is written there here.
    global _STATE_DIR
    if _STATE_DIR is None:
        _STATE_DIR = Path(tempfile.mkdtemp(prefix="stepledger-sim-"))
    return _STATE_DIR


def projector(stage: Stage, actor: Actor) -> None:
    """Fold the log into projections, partition by partition, from its start."""
    sched, broker, monitor = stage.sched, stage.broker, stage.monitor
    projections: dict[str, WorkflowProjection] = {}
    positions = [p.start for p in broker.partitions]
    since = list(positions)  # a projector started after retention folds the tail only
    stage.projected[:] = positions
    while True:
        read = False
        for number, part in enumerate(broker.partitions):
            at = max(positions[number], part.start)
            if at >= part.end:
                continue
            sched.point(actor)
            record = part.records[at]
            positions[number] = stage.projected[number] = at + 1
            read = True
            event = broker.decode(record)
            if event is None:
                continue  # a foreign writer's bytes: dead-lettered, the fold goes on
            projection = projections.get(event.workflow_id)
            if projection is None:
                projection = projections[event.workflow_id] = WorkflowProjection(event.workflow_id)
            batch = BatchFold()
            batch.add(projection, event, (record.topic, number, at), record.value)
            batch.tables()
            monitor.check_projection(event.workflow_id, projection.state, since[number], at + 1)
        if not read:
            sched.sleep(actor, IDLE_S)


def people(stage: Stage, actor: Actor) -> None:
    """Answer open escalations by checking the services; grant pending approvals."""
    sched, broker = stage.sched, stage.broker
    reader = stage.reader(actor)
    factory = EventFactory("sim", actor.name, lambda: sched.wall(actor))
    answerer = Answerer(LogClient(broker, actor, stage.acks), factory, reader)
    while True:
        sched.sleep(actor, PEOPLE_EVERY_S)
        for workflow_id in stage.workflow_ids():
            events = reader.read(workflow_id).events
            for item in EscalationQueue().extend(events).open():
                verdict = _verdict(stage.services, item)
                # Answered meanwhile, or no longer open: looked at again next time.
                with contextlib.suppress(StepLedgerError):
                    answerer.answer_escalation(
                        workflow_id, item.escalation_id, verdict, by=actor.name, note="checked"
                    )
            for step in replay(workflow_id, events).steps.values():
                gate = step.approval
                if step.status is not StepStatus.AWAITING_APPROVAL or gate is None:
                    continue
                with contextlib.suppress(StepLedgerError):
                    answerer.answer_approval(
                        workflow_id,
                        step.step_id,
                        granted=True,
                        by=actor.name,
                        note="looks right",
                        digest=gate.digest,
                    )


def _verdict(services: sv.Services, item: OpenEscalation) -> Verdict:
    """What a person checking the service answers."""
    if Verdict.HAPPENED not in item.options:
        return Verdict.CLEARED if Verdict.CLEARED in item.options else item.options[0]
    arguments = item.arguments if isinstance(item.arguments, dict) else {}
    ref = str(arguments.get("ref", ""))
    happened = services.counts[(ref, sv.KIND_OF.get(item.tool, ""))] > 0
    return Verdict.HAPPENED if happened else Verdict.NOT_HAPPENED

"""The checkpointer, and a second deployment's checkpointer writing into the same topic.

**The checkpointer** is the real :class:`~stepledger.checkpoints.writer.Checkpointer` with
its clients in memory (:mod:`.statetopic`): it restores from the checkpoint topic, folds
the step log record by record (one record per crossing, through its own ``_take``, which
also notices records deleted unread), writes a round every ``ROUND_MS`` (checkpoints, the
directory, the partition's progress), and a killed one restores again.  Retention may
delete a partition's head only up to what it vouches for (see :func:`retention`), and
readers (:meth:`.stage.Stage.reader`) then complete a workflow's history from its checkpoint
(:class:`~stepledger.history.guard.HistoryGuard` over the real
:class:`~stepledger.checkpoints.view.CheckpointView`).

**Another deployment** (``other``) is a second step log under the same name (a log created
again, or another cluster's), with other identity (``logid``), whose workflows have the
same ids as this run's and whose checkpointer writes into this run's checkpoint topic, as
every deployment did with 0.3.0's shared default.  Its log is written before the run
(:func:`other_log`): each workflow a different number of read-only steps, then finished,
so its checkpoints and progress cover offsets below and past this log's end.  Only the
log identity tells its records apart from this log's.
"""

from __future__ import annotations

import random

from stepledger.checkpoints.writer import Checkpointer, CheckpointOptions
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain.enums import (
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    WorkflowStatus,
)
from stepledger.domain.factory import EventFactory
from stepledger.kafka.logid import LogIdentity
from stepledger_dev.simulate.scheduler import Actor, Scheduler
from stepledger_dev.simulate.simlog import Broker
from stepledger_dev.simulate.stage import OTHER_ID, Stage
from stepledger_dev.simulate.statetopic import MemProducer, SimLogStart, step_message

#: How often a checkpointer writes a round (simulated milliseconds).
ROUND_MS = 400
#: A workflow is checkpointed after this many new records (between rounds).
EVERY_EVENTS = 8
#: How long an idle checkpointer sleeps (simulated seconds).
IDLE_S = 0.05


def checkpointer(stage: Stage, actor: Actor) -> None:
    """This deployment's checkpointer over the run's step log."""
    _run(stage, actor, stage.broker, stage.settings_for(actor), stage.identity, own=True)


def other(stage: Stage, actor: Actor) -> None:
    """The other deployment's checkpointer over its own log, into the same checkpoint topic."""
    settings = stage.settings_for(actor).model_copy(update={"fleet_id": "other"})
    if stage.other is None:
        workflows, parts = stage.workflow_ids(), stage.plan.partitions
        stage.other = other_log(stage.plan.seed, workflows, parts, stage.sched)
    broker = stage.other
    _run(stage, actor, broker, settings, LogIdentity(broker.topic, OTHER_ID), own=False)


def _run(
    stage: Stage,
    actor: Actor,
    broker: Broker,
    settings: Settings,
    identity: LogIdentity,
    *,
    own: bool,
) -> None:
    sched = stage.sched
    options = CheckpointOptions(every_events=EVERY_EVENTS, every_s=ROUND_MS / 1000)
    numbers = range(len(broker.partitions))
    writer = Checkpointer(settings, numbers, options, codec=broker.codec, identity=identity)
    writer._producer = MemProducer(stage.state_topics, sched, actor)  # type: ignore[assignment]
    writer._log_start = SimLogStart(broker)  # type: ignore[assignment]
    writer._points = writer._view()
    if own:
        stage.checkpointer = writer
    sched.point(actor)
    writer.restore()  # reads the checkpoint topic: one step
    positions = {p.number: p.progress + 1 for p in writer._parts.values()}
    last = sched.now_ms
    while True:
        read = False
        for number, part in enumerate(broker.partitions):
            held = writer._parts[number]
            at = max(positions[number], part.start)  # a consumer lands at the log start
            if held.broken or at >= part.end:
                continue
            sched.point(actor)
            writer.take(step_message(part.records[at]))
            positions[number] = at + 1
            read = True
        if sched.now_ms - last >= ROUND_MS:
            writer.round()
            last = sched.now_ms
        if not read:
            sched.sleep(actor, IDLE_S)


def other_log(seed: int, workflows: list[str], partitions: int, sched: Scheduler) -> Broker:
    """The other deployment's step log: the same workflow ids, each run to its end there."""
    rng = random.Random(f"other:{seed}")
    broker = Broker("sim.steps", partitions, sched)
    factory = EventFactory("other", "other-agent", sched.broker_now)
    for workflow in workflows:
        runner = f"other~{workflow}"
        started = ev.WorkflowStarted(name="other", attempt=1, read_only=False, runner=runner)
        broker.append(factory.envelope(workflow, None, started, runner), "other-agent")
        for n in range(rng.randint(1, 40)):
            for event in _read_step(factory, workflow, f"look#{n + 1}", runner):
                broker.append(event, "other-agent")
        done = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED, runner=runner)
        broker.append(factory.envelope(workflow, None, done, runner), "other-agent")
    return broker


def _read_step(
    factory: EventFactory, workflow: str, step: str, runner: str
) -> tuple[ev.Event, ev.Event]:
    key = ids.idempotency_key(workflow, step, "catalog.quote")
    intent = ev.StepIntended(
        sequence=int(step.split("#")[1]),
        tool="catalog.quote",
        effect=EffectClass.READ_ONLY,
        policy=ResolutionPolicy.ESCALATE,
        idempotency_key=key,
        arguments_json="{}",
        arguments_digest=ids.digest("{}"),
        deadline=factory.clock(),
        attempt=1,
        epoch=1,
        runner=runner,
    )
    outcome = ev.StepOutcome(
        status=OutcomeStatus.SUCCEEDED,
        result_json='{"other": true}',
        source=Source.AGENT,
        runner=runner,
    )
    return (
        factory.envelope(workflow, step, intent, runner),
        factory.envelope(workflow, step, outcome, runner),
    )


def retention(stage: Stage, workflow: str) -> int:
    """Delete the head of a workflow's partition: every record all its readers are past.

    Retention runs for days and readers follow within seconds, so it deletes only what the
    checkpointer vouches for (its progress; nothing without one), the recovery daemon
    checkpointed and the projector read; the offset the partition now starts at.
    """
    number = stage.broker.partition_of(workflow)
    part = stage.broker.partitions[number]
    kinds = {a.kind for a in stage.plan.actors}
    # Without a checkpointer nothing vouches for what retention deletes: it deletes nothing.
    held = None if stage.checkpointer is None else stage.checkpointer._parts.get(number)
    bounds = [part.end, 0 if held is None or held.broken else held.progress + 1]
    if "recovery" in kinds:
        bounds.append(stage.recovery_store.positions.get((stage.broker.topic, number), 0))
    if "projector" in kinds:
        bounds.append(stage.projected[number])
    part.start = max(part.start, min(bounds))
    return part.start

"""The stage: what one run's actors share, built by :mod:`.world` and handed to each actor.

It holds the plan, the scheduler, the step log, the tool services, the lost or late
acknowledgements, the stores that outlive a process (the recovery daemon's checkpoints,
the checkpoint topic), where the projector has read to, the checks (the monitor), and
what a process is started with (its settings, its workflow reader).  The actor modules
(:mod:`.daemons`, :mod:`.checkpointing`) take a stage; only the world drives the run.
"""

from __future__ import annotations

from pydantic import SecretStr

from stepledger.checkpoints.view import CheckpointView
from stepledger.checkpoints.writer import Checkpointer
from stepledger.config import Settings
from stepledger.history.guard import HistoryGuard
from stepledger.kafka.logid import LogIdentity
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger_dev.simulate import services as sv
from stepledger_dev.simulate import statetopic
from stepledger_dev.simulate.invariants import Monitor
from stepledger_dev.simulate.plan import Plan
from stepledger_dev.simulate.scheduler import Actor, Scheduler
from stepledger_dev.simulate.simlog import AckFaults, Broker, SimReader

TOPIC = "sim.steps"
#: Every simulated process shares one operator's redaction key (secrets as keyed HMACs).
REDACTION_KEY = "simulated-operator-key-0001"
#: This run's step log and the other deployment's: one name, two identities.
OWN_ID = "sim-log-0001"
OTHER_ID = "sim-log-0002"


class Stage:
    """What a run's actors share: scheduler, broker, services, stores, monitor."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sched = Scheduler(plan.seed)
        self.broker = Broker(TOPIC, plan.partitions, self.sched)
        self.services = sv.Services(self.sched)
        self.acks = AckFaults()
        self.recovery_store = InMemoryCheckpointStore()
        self.identity = LogIdentity(TOPIC, OWN_ID)
        checkpoints = Settings(topic=TOPIC).checkpoint_topic
        self.state_topics = {checkpoints: statetopic.MemTopic.of(checkpoints, plan.partitions)}
        """The checkpoint topic (shared with the other deployment when the plan has one)."""
        self.checkpointer: Checkpointer | None = None
        """This deployment's newest checkpointer (what retention may delete up to)."""
        self.projected = [0] * plan.partitions
        """Where the projector has read each partition to."""
        self.other: Broker | None = None
        """The other deployment's step log (written once, before it is first read)."""
        self.monitor = Monitor(self.broker, self.services, set())
        self.state_topics[checkpoints].on_write.append(self.monitor.check_checkpoint)
        self.daemon: RecoveryDaemon | None = None

    def workflow_ids(self) -> list[str]:
        """The workflows the plan's agents run."""
        return sorted({a.workflow for a in self.plan.actors if a.workflow})

    def settings_for(self, actor: Actor) -> Settings:
        """One simulated process's settings (one operator's redaction key for all)."""
        return Settings(
            fleet_id="sim",
            producer_id=actor.name,
            topic=self.broker.topic,
            redaction_key=SecretStr(REDACTION_KEY),
        )

    def reader(self, actor: Actor) -> SimReader:
        """An actor's workflow reader: a history retention shortened is completed from this
        log's checkpoints (through the real view and guard), and every history it reads is
        checked for events of another log."""
        settings = self.settings_for(actor)
        ends = statetopic.SimLogStart(self.broker)
        view = CheckpointView(settings, identity=self.identity, log_ends=ends)
        guard = HistoryGuard(settings, self.broker.codec, log_start=ends, checkpoints=view)
        return SimReader(self.broker, actor, guard, self.monitor.check_history)

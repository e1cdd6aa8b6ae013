"""The crash plan: which process dies where, drawn from a seed so a failure can be replayed."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from enum import StrEnum


class CrashPoint(StrEnum):
    """A labelled place where the harness kills a process."""

    NONE = "none"
    BEFORE_INTENT = "agent:before_intent"
    AFTER_INTENT = "agent:after_intent"
    AFTER_CALL = "agent:after_call"
    AFTER_OUTCOME = "agent:after_outcome"
    CRASH_LOOP = "agent:crash_loop"
    RESUME_RACE = "agent:resume_races_recovery"
    FROZEN_AFTER_INTENT = "agent:frozen_after_intent"
    SECOND_RUNNER = "agent:second_runner"
    REWORDED_RESUME = "agent:reworded_resume"
    """Killed at a point of the charge or the email, resumed wording their free text otherwise."""
    PROJECTOR_MID_BATCH = "projector:mid_batch"
    RECOVERY_MID_RESOLUTION = "recovery:mid_resolution"
    CONSUMER_STOP = "consumer:sigstop_sigcont"
    BROKER_RESTART = "broker:graceful_restart"
    BROKER_LEADER_KILL = "broker:leader_sigkill"
    BROKER_STOP = "broker:sigstop_sigcont"
    RECOVERY_STOP = "recovery:sigstop_sigcont"
    PROJECTOR_ADDED = "projector:added"
    RECOVERY_ADDED = "recovery:added"
    SECOND_DEPLOYMENT = "cluster:second_deployment"
    """A whole second deployment ran on the same cluster (``--two-deployments``)."""


#: Where an agent can die; the agent's own kill-point labels, per step.
AGENT_POINTS = (
    CrashPoint.BEFORE_INTENT,
    CrashPoint.AFTER_INTENT,
    CrashPoint.AFTER_CALL,
    CrashPoint.AFTER_OUTCOME,
)
INFRA_POINTS = (
    CrashPoint.PROJECTOR_MID_BATCH,
    CrashPoint.RECOVERY_MID_RESOLUTION,
    CrashPoint.CONSUMER_STOP,
    CrashPoint.BROKER_RESTART,
    CrashPoint.BROKER_LEADER_KILL,
    CrashPoint.BROKER_STOP,
)
#: Faults of a scaled run (several projectors and recovery daemons in their groups), by
#: round: one of each kind, so a group never runs out of members.  A kill is not followed
#: by a restart there: the group carries on without the member until one is added.
SCALE_FAULTS = (
    (CrashPoint.PROJECTOR_MID_BATCH, 0),
    (CrashPoint.RECOVERY_STOP, 0),
    (CrashPoint.PROJECTOR_ADDED, 0),
    (CrashPoint.CONSUMER_STOP, 1),
    (CrashPoint.RECOVERY_MID_RESOLUTION, 1),
    (CrashPoint.RECOVERY_ADDED, 1),
)
#: Faults only a replicated Apache Kafka cluster takes without losing acknowledged events.
CLUSTER_POINTS = (CrashPoint.BROKER_LEADER_KILL, CrashPoint.BROKER_STOP)


#: How long a resuming agent waits past a deadline, against the daemon's 0.5 s: shorter,
#: equal, longer, so either may decide first (the resume-races-recovery plan).
RACE_GRACES = (0.1, 0.5, 2.0)
#: The effectful steps a race kills after (charge: query; book: compensate).
RACE_STEPS = (1, 2)
#: The steps with free-text arguments a resumed agent words otherwise (charge memo, email body).
REWORD_STEPS = (1, 3)


@dataclass(frozen=True)
class AgentKill:
    """Kill the agent at ``point`` of step ``step`` (0-based) on one attempt."""

    point: CrashPoint
    step: int
    grace_s: float = 0.5
    """For RESUME_RACE: the grace of the agent restarted at once after the kill."""


@dataclass(frozen=True)
class WorkflowPlan:
    """One workflow: its id and the kill (or none) for each successive attempt."""

    workflow_id: str
    kills: tuple[AgentKill | None, ...]
    reword: bool = False
    """A resumed attempt words the free-text arguments otherwise (a re-asked model)."""

    @property
    def label(self) -> CrashPoint:
        """The crash point this workflow exercises (its first attempt's)."""
        if self.reword:
            return CrashPoint.REWORDED_RESUME
        first = self.kills[0] if self.kills else None
        if len(self.kills) > 1 and all(k is not None for k in self.kills):
            return CrashPoint.CRASH_LOOP
        return CrashPoint.NONE if first is None else first.point


@dataclass(frozen=True)
class InfraFault:
    """A fault on a shared process during one round of agents."""

    point: CrashPoint
    round: int


@dataclass(frozen=True)
class ChaosPlan:
    """Everything the run will do, derived only from (workflows, seed, options)."""

    seed: int
    workflows: tuple[WorkflowPlan, ...]
    infra: tuple[InfraFault, ...] = field(default=())


def make_plan(
    workflows: int,
    seed: int,
    *,
    steps: int,
    max_attempts: int,
    broker_restarts: bool,
    broker_kills: bool = False,
    scaled: bool = False,
    scaled_roles: tuple[str, ...] = ("projector", "recovery"),
    crash_loop_share: float = 0.05,
    clean_share: float = 0.15,
    race_share: float = 0.2,
    frozen_share: float = 0.1,
    second_share: float = 0.05,
    reword_share: float = 0.1,
) -> ChaosPlan:
    """Draw a plan: most workflows die once at some agent crash point, a few crash-loop.

    A ``race_share`` of them die after an effect and are restarted at once, while the
    recovery daemon is due to decide the same step (``RESUME_RACE``).  ``broker_kills``
    adds the cluster faults (a partition leader SIGKILLed, a broker SIGSTOPped); ``scaled``
    replaces the daemon faults with those of several members per group (``SCALE_FAULTS``), of
    the ``scaled_roles`` (a daemon with one member keeps none: it has no member to spare).
    A ``reword_share`` die at a point of the charge or the email and are resumed by an agent
    that words their free text otherwise, as a model asked again would (``reword``).
    """
    rng = random.Random(seed)
    races = round(workflows * race_share)
    frozen = round(workflows * frozen_share)
    seconds = round(workflows * second_share)
    rewords = round(workflows * reword_share)
    plans = [
        _workflow(rng, f"chaos-{seed}-{i:04d}", steps, max_attempts, crash_loop_share, clean_share)
        for i in range(workflows - races - frozen - seconds - rewords)
    ]
    # A model asked again on the resume words the charge's memo and the email's body anew.
    reword_rng = random.Random(f"reword-{seed}")
    plans += [
        WorkflowPlan(
            f"chaos-{seed}-reword-{i:04d}",
            (AgentKill(reword_rng.choice(AGENT_POINTS), reword_rng.choice(REWORD_STEPS)), None),
            reword=True,
        )
        for i in range(rewords)
    ]
    # Two live runners meet at a step (the email, the charge or the booking).
    second_rng = random.Random(f"second-{seed}")
    plans += [
        WorkflowPlan(
            f"chaos-{seed}-second-{i:04d}",
            (AgentKill(CrashPoint.SECOND_RUNNER, second_rng.choice((1, 2, 3))),),
        )
        for i in range(seconds)
    ]
    # Frozen after an intent (SIGSTOP past its deadline), resumed elsewhere, then continued.
    frozen_rng = random.Random(f"frozen-{seed}")
    plans += [
        WorkflowPlan(
            f"chaos-{seed}-frozen-{i:04d}",
            (AgentKill(CrashPoint.FROZEN_AFTER_INTENT, frozen_rng.choice((1, 2, 3))), None),
        )
        for i in range(frozen)
    ]
    # Drawn apart, so the other workflows of a seed keep the plan they always had.
    race_rng = random.Random(f"race-{seed}")
    plans += [
        WorkflowPlan(
            f"chaos-{seed}-race-{i:04d}",
            (AgentKill(CrashPoint.RESUME_RACE, race_rng.choice(RACE_STEPS), grace), None),
        )
        for i, grace in zip(range(races), itertools.cycle(RACE_GRACES), strict=False)
    ]
    daemon_points = {p for p, _ in SCALE_FAULTS}
    infra_points = [
        p
        for p in INFRA_POINTS
        if (broker_restarts or p is not CrashPoint.BROKER_RESTART)
        and (broker_kills or p not in CLUSTER_POINTS)
        and not (scaled and p in daemon_points)
    ]
    # Round 0 runs every workflow's first attempt (streams of events: the projector is busy);
    # round 1 resumes the crashed ones (in-doubt steps fall due: recovery is busy).
    copies = 2 if workflows >= 20 else 1
    faults = [
        InfraFault(point, copy if copies == 2 else rng.choice((0, 1)))
        for point in infra_points
        for copy in range(copies)
    ]
    if scaled:
        faults += [
            InfraFault(point, round_no)
            for point, round_no in SCALE_FAULTS
            if _role(point) in scaled_roles
        ]
    faults.sort(key=lambda f: (f.round, f.point.value))
    return ChaosPlan(seed, tuple(plans), tuple(faults))


def _workflow(
    rng: random.Random,
    workflow_id: str,
    steps: int,
    max_attempts: int,
    crash_loop_share: float,
    clean_share: float,
) -> WorkflowPlan:
    roll = rng.random()
    if roll < crash_loop_share:
        # Killed on every attempt, one past the limit: it must end dead-lettered.
        kills = tuple(
            AgentKill(rng.choice(AGENT_POINTS), rng.randrange(steps))
            for _ in range(max_attempts + 1)
        )
        return WorkflowPlan(workflow_id, kills)
    if roll < crash_loop_share + clean_share:
        return WorkflowPlan(workflow_id, (None,))
    return WorkflowPlan(
        workflow_id, (AgentKill(rng.choice(AGENT_POINTS), rng.randrange(steps)), None)
    )


def _role(point: CrashPoint) -> str:
    """The daemon a scale fault hits (``consumer:`` is the projectors' consumer)."""
    role = point.value.split(":", 1)[0]
    return "projector" if role == "consumer" else role

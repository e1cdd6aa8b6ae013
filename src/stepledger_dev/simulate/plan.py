"""A run's plan: which actors take part and which faults the scheduler injects, and when.

A seed makes a plan (:func:`generate`); the plan and the seed together make the run: the
plan says *what* happens (actors, faults at given turns), the seed's generator picks the
interleaving turn by turn.  Shrinking drops actors and faults from a plan and runs it again
under the same seed, so a plan is data that encodes to one line (:meth:`Plan.encode`) and
decodes back (:meth:`Plan.decode`): ``stepledger simulate --seed S --schedule LINE``
replays it.

Fault kinds (each a scheduler choice, at a turn, on a target):

``freeze`` an actor for ``value`` ms (it misses every turn meanwhile; its clocks move on),
``kill`` it (it never runs again; a new process of the same kind starts ``value`` ms
later: a resumed agent, a restarted daemon), ``skew`` its wall clock by ``value`` ms from
the broker's (an agent's: from the fleet's, ``Plan.agent_skew_ms``), ``ack_lost`` /
``ack_refused`` / ``ack_late`` on its next append, ``call_after`` / ``call_before`` on its
next tool call (effect made then a timeout; refused, no effect), ``dup`` the newest record
of a workflow's partition delivered again, ``foreign`` bytes from a foreign writer appended
to a workflow's partition, ``retention`` deleting the head of a workflow's partition (what
every reader is past: the checkpointer's progress, the recovery daemon's checkpoint, the
projector's position).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace

AGENT_KINDS = ("trip", "paynotify", "framework")
#: Where an agent's pause or crash may land (see ``Profile.windows``).
WINDOWS = ("crossing", "intent", "outcome")
INFRA_KINDS = ("recovery", "projector", "people", "checkpointer")
#: Another deployment's checkpointer writing into this log's checkpoint topic.
OTHER = "other"
ACTOR_FAULTS = (
    "freeze",
    "kill",
    "skew",
    "ack_lost",
    "ack_refused",
    "ack_late",
    "call_after",
    "call_before",
)
LOG_FAULTS = ("dup", "foreign", "retention")
FAULT_KINDS = ACTOR_FAULTS + LOG_FAULTS
#: The grace past a step's deadline that recovery and a resuming agent wait (simulated
#: seconds): the liveness bound allows it, and agents' skews stay within it.
GRACE_S = 0.5


@dataclass(frozen=True)
class ActorSpec:
    """One actor the run starts: its kind, its workflow (agents) and when it starts."""

    name: str
    kind: str
    workflow: str = ""
    start: int = 0
    """The turn it starts at (a second runner of a workflow starts late: a claim race)."""
    options: tuple[str, ...] = ()
    """Agent variants: ``cancel`` (the customer cancels after booking), ``reword`` (a model
    words a call differently on a resume), ``approval`` (a payment needs a person's
    approval), ``swap_card`` (a resumed model pays with another card)."""


@dataclass(frozen=True)
class Fault:
    """One fault: of a kind, on a target (an actor or a workflow), at a point of the run."""

    at: int
    """Aimed at an actor: at its ``at``-th boundary crossing, or (negative) right after its
    ``-at``-th step intent (its current process's), or (``-AFTER_OUTCOME - n``) right after
    its ``n``-th step outcome; at the log: at the run's ``at``-th turn."""
    kind: str
    target: str
    value: int = 0


@dataclass(frozen=True)
class Plan:
    """Actors and faults; with the seed, everything a run does."""

    seed: int
    partitions: int = 2
    actors: tuple[ActorSpec, ...] = ()
    faults: tuple[Fault, ...] = ()
    turns: int = 600
    """Turns with faults; then every fault ends and the run settles (see ``world``)."""
    defects: tuple[str, ...] = field(default=())
    """Old behaviours switched back on (test-only, :mod:`.defects`)."""
    agent_skew_ms: int = 0
    """Every agent process's wall clock minus the broker's (and the daemons'): a fleet of
    hosts that agree with each other but not with the brokers.  A ``skew`` fault on an agent
    is off from this."""

    def encode(self) -> str:
        """The plan as one line of JSON (replay it with ``--schedule``)."""
        data = asdict(self)
        data["actors"] = [
            [a.name, a.kind, a.workflow, a.start, list(a.options)] for a in self.actors
        ]
        data["faults"] = [[f.at, f.kind, f.target, f.value] for f in self.faults]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Plan:
        """The plan of :meth:`encode`'s line."""
        data = json.loads(text)
        actors = tuple(ActorSpec(n, k, w, s, tuple(o)) for n, k, w, s, o in data["actors"])
        faults = tuple(Fault(a, k, t, v) for a, k, t, v in data["faults"])
        return cls(
            seed=int(data["seed"]),
            partitions=int(data.get("partitions", 2)),
            actors=actors,
            faults=faults,
            turns=int(data.get("turns", 600)),
            defects=tuple(data.get("defects", ())),
            agent_skew_ms=int(data.get("agent_skew_ms", 0)),
        )

    def without_actor(self, name: str) -> Plan:
        """The plan with one actor (and the faults aimed at it) left out."""
        actors = tuple(a for a in self.actors if a.name != name)
        faults = tuple(f for f in self.faults if f.target != name)
        return replace(self, actors=actors, faults=faults)

    def without_fault(self, index: int) -> Plan:
        """The plan with one fault left out."""
        return replace(self, faults=self.faults[:index] + self.faults[index + 1 :])


@dataclass(frozen=True)
class Profile:
    """What plans a seed may make: agent kinds, their options and fault kinds."""

    kinds: tuple[str, ...] = ("trip", "paynotify", "framework")
    options: tuple[str, ...] = ("cancel", "reword", "approval", "swap_card")
    faults: tuple[str, ...] = FAULT_KINDS
    fleet_skew_ms: int = 120_000
    """The agents' common clock offset from the broker's (``Plan.agent_skew_ms``) stays
    within this: recovery decides by its own clock whatever the agents' say."""
    fleet_chance: float = 0.5
    """How often a plan's agents are off the broker's clock at all."""
    max_skew_ms: int = 120_000
    """Each agent's own skew (from the fleet's) stays within this, both directions: two
    agents' clocks may differ by minutes, far more than the grace (``GRACE_S``); a resuming
    agent settles a step by the broker's append times, whatever its clock (docs/guarantees.md,
    "Largest skew")."""
    skew_daemons: bool = True
    """Whether the daemons' own clocks (the recovery daemon's, the projector's, people's,
    the checkpointer's) may be skewed from the broker's and step mid-run too."""
    daemon_skew_ms: int = 120_000
    """A daemon's skew stays within this, both directions: the recovery daemon's waits run
    on a clock that never steps, whatever its wall clock does."""
    skew_sign: int = 0
    """0: agents' clocks off both ways; 1: only ahead of the broker's; -1: only behind."""
    second_runners: float = 0.3
    """How often a workflow gets a second runner while its first is alive."""
    second_start: tuple[int, int] = (3, 80)
    """The turns a second runner starts between."""
    windows: tuple[str, ...] = WINDOWS
    """Where an agent's pause or crash lands: at a ``crossing`` (any), right after an
    ``intent`` (before its call), right after an ``outcome`` (before what follows)."""
    shared_checkpoints: float = 0.3
    """How often another deployment's checkpointer writes into this log's checkpoint topic
    (0.3.0's shared default): its log has the same name and workflow ids, another identity."""
    turns: int = 600
    fault_turns: int = 250
    """Faults fire in the first turns, while the agents run."""


#: Variants that reach a defect still open on main (each a ``explore.KNOWN_OPEN`` entry): a
#: plan of the default profile never draws them.  Once a fix lands its variant moves into
#: ``Profile``'s defaults (or the skew bounds grow), and CI explores it on every run.
PENDING: dict[str, str] = {}
#: Every variant, those of open defects included (``stepledger simulate --all``).
FULL = Profile()


def generate(seed: int, profile: Profile | None = None) -> Plan:
    """The plan a seed makes under a profile (the default: what main is expected to pass)."""
    profile = profile or Profile()
    rng = random.Random(f"plan:{seed}")
    actors: list[ActorSpec] = []
    for n in range(rng.randint(1, 3)):
        kind = rng.choice(profile.kinds)
        workflow = f"w{n + 1}"
        options = tuple(o for o in profile.options if _fits(kind, o) and rng.random() < 0.3)
        actors.append(ActorSpec(f"a{n + 1}", kind, workflow, 0, options))
        if rng.random() < profile.second_runners:
            # A second runner of the same workflow: it opens it while the first is alive.
            later = tuple(o for o in options if o != "cancel")
            actors.append(
                ActorSpec(f"a{n + 1}b", kind, workflow, rng.randint(*profile.second_start), later)
            )
    actors += [ActorSpec(kind, kind) for kind in INFRA_KINDS]
    if rng.random() < profile.shared_checkpoints:
        actors.append(ActorSpec(OTHER, OTHER))
    fleet = _fleet(rng, profile)
    faults = [_fault(rng, profile, actors) for _ in range(rng.randint(0, 6))]
    if "skew" in profile.faults:
        # Some agents' clocks are off from their start (a host whose clock drifted).
        for agent in actors:
            if agent.kind in AGENT_KINDS and rng.random() < 0.35:
                faults.append(Fault(0, "skew", agent.name, _skew(rng, profile)))
    faults.sort(key=lambda f: (f.at, f.kind, f.target))
    partitions = rng.randint(1, 3)
    return Plan(seed, partitions, tuple(actors), tuple(faults), profile.turns, (), fleet)


#: An agent process crosses about this many boundaries in one workflow.
AGENT_CROSSINGS = 80
#: An agent process appends up to this many intents (and outcomes) in one workflow.
AGENT_INTENTS = 4
#: A fault at ``-AFTER_OUTCOME - n`` fires right after the actor's n-th step outcome.
AFTER_OUTCOME = 100
#: Faults on a daemon fire within its first this many crossings.
DAEMON_CROSSINGS = 300


def _fits(kind: str, option: str) -> bool:
    if option == "cancel":
        return kind == "trip"
    return kind == "framework"


def _fault(rng: random.Random, profile: Profile, actors: list[ActorSpec]) -> Fault:
    # Pauses and crashes are drawn twice as often: most windows are between two events.
    kind = rng.choice(profile.faults + tuple(k for k in ("freeze", "kill") if k in profile.faults))
    if kind in LOG_FAULTS:
        workflows = sorted({a.workflow for a in actors if a.workflow})
        at = rng.randint(0, profile.fault_turns)
        return Fault(at, kind, rng.choice(workflows) if workflows else "w1")
    agents = [a for a in actors if a.kind in AGENT_KINDS]
    others = [a for a in actors if a.kind not in AGENT_KINDS]
    if kind == "skew" and not profile.skew_daemons:
        others = []
    # Most faults hit agents (where the windows between an intent and its call are).
    chosen = rng.choice(agents if agents and (not others or rng.random() < 0.75) else others)
    target = chosen.name
    at = rng.randint(0, AGENT_CROSSINGS if chosen.kind in AGENT_KINDS else DAEMON_CROSSINGS)
    if kind == "skew":
        at = rng.choice((0, at))
    elif kind in ("freeze", "kill") and chosen.kind in AGENT_KINDS:
        window = _window(rng, profile)
        if window != "crossing":
            at = -rng.randint(1, AGENT_INTENTS)  # between an intent and its call
        if window == "outcome":
            at -= AFTER_OUTCOME  # between an outcome and what follows (a compensation)
    if kind == "freeze":
        return Fault(at, kind, target, rng.choice((300, 1000, 2500, 4000, 8000)))
    if kind == "kill":
        return Fault(at, kind, target, rng.choice((100, 1000, 3000)))
    if kind == "skew":
        bound = None if chosen.kind in AGENT_KINDS else profile.daemon_skew_ms
        return Fault(at, kind, target, _skew(rng, profile, bound))
    return Fault(at, kind, target)


#: How often a pause or crash of an agent lands in each window (of the profile's).
_WINDOWS = {"crossing": 0.5, "intent": 0.35, "outcome": 0.15}


def _window(rng: random.Random, profile: Profile) -> str:
    choices = [w for w in _WINDOWS if w in profile.windows]
    return rng.choices(choices, [_WINDOWS[w] for w in choices])[0]


def _fleet(rng: random.Random, profile: Profile) -> int:
    if rng.random() >= profile.fleet_chance:
        return 0
    return _skew(rng, profile, profile.fleet_skew_ms)


def _skew(rng: random.Random, profile: Profile, bound: int | None = None) -> int:
    bound = profile.max_skew_ms if bound is None else bound
    low = 0 if profile.skew_sign > 0 else -bound
    high = 0 if profile.skew_sign < 0 else bound
    return rng.randint(low, high)

"""One seeded scheduler: actors on threads that run only while they hold the baton.

Every actor (an agent process, the recovery daemon, the projector, a person) is a thread
that runs the library's own blocking code.  It runs only between two boundary crossings
(:meth:`Scheduler.point`: an append, a read, a tool call, a clock reading): at each one it
hands the baton back and waits, and the scheduler picks who runs next from its seeded
random generator.  Exactly one actor runs at a time, so a seed and a plan replay exactly.

Time is simulated.  ``now_ms`` is the broker's clock (the reference); an actor's wall clock
is ``now_ms`` plus its skew, and its monotonic clock is ``now_ms`` itself (a paused process
sees its monotonic clock move on, as a real one does).  Time moves only between two
crossings: a few milliseconds per turn, to the next waker when everybody sleeps, and by
the faults that jump it.

A killed actor never runs again: its next crossing raises :class:`Killed` (a
``BaseException``, as a SIGKILL leaves nothing to catch), and the scheduler waits for the
thread to unwind before it goes on, so the unwinding cannot race anything.
"""

from __future__ import annotations

import enum
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

#: The broker's clock at the start of every run.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: How far time moves between two turns (milliseconds, picked by the seed).
TURN_MS = (0, 0, 1, 2, 5, 10, 25)
#: Longest a thread may take to reach its next crossing (a bug, not a schedule).
STUCK_S = 30.0


class Killed(BaseException):
    """Raised in a killed actor's thread at its next crossing: it never runs again."""


class ActorState(enum.Enum):
    """Where an actor is, as the scheduler sees it."""

    READY = "ready"
    SLEEPING = "sleeping"
    FROZEN = "frozen"
    KILLED = "killed"
    DONE = "done"


@dataclass(eq=False)
class Actor:
    """One simulated process: its thread, its clocks and how it ended."""

    name: str
    kind: str
    body: Callable[[Actor], None]
    skew_ms: int = 0
    """Its wall clock minus the broker's."""
    state: ActorState = ActorState.READY
    wake_ms: int = 0
    """When a sleeping actor is ready again (broker time)."""
    thaw_ms: int = 0
    """When a frozen actor runs again."""
    ended: str = ""
    """How it ended (a status word, or an error's one line)."""
    crash: str = ""
    """An exception outside the library's tree, with its traceback: a bug."""
    crossings: int = 0
    """How many boundaries it crossed (faults aimed at it fire at one of them)."""
    intents: int = 0
    """How many step intents it appended (a fault may fire right after one of them)."""
    outcomes: int = 0
    """How many step outcomes it appended (a fault may fire right after one of them)."""
    notes: dict[str, object] = field(default_factory=dict)
    """What the actor's body wants the invariants to know (its workflow handle, ...)."""
    skews: list[tuple[int, int]] = field(default_factory=list)
    """Each time its skew was set (broker ms, skew ms), oldest first: what its wall clock
    read at any moment, so a time it recorded can be put on the broker's clock."""
    _baton: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    _thread: threading.Thread | None = None
    _killed: bool = False

    @property
    def live(self) -> bool:
        """True until it ended or was killed."""
        return self.state not in (ActorState.KILLED, ActorState.DONE)

    def set_skew(self, now_ms: int, skew_ms: int) -> None:
        """Set its wall clock ``skew_ms`` off the broker's from ``now_ms`` on."""
        self.skew_ms = skew_ms
        self.skews.append((now_ms, skew_ms))

    def on_broker_clock(self, wall_ms: int) -> int | None:
        """When (broker ms) its wall clock read ``wall_ms`` (ms since ``EPOCH``); None when
        no skew it had fits (a reading it never made)."""
        spans = self.skews or [(0, self.skew_ms)]
        for i in range(len(spans) - 1, -1, -1):
            since, skew = spans[i]
            until = spans[i + 1][0] if i + 1 < len(spans) else None
            at = wall_ms - skew
            if at >= since and (until is None or at <= until):
                return at
        return None


class SimTimer:
    """An actor's monotonic clock and sleeps, in simulated time (the SDK's Timer)."""

    def __init__(self, sched: Scheduler, actor: Actor) -> None:
        self.sched, self.actor = sched, actor

    def monotonic(self) -> float:
        """Seconds of simulated time, read at a crossing."""
        return self.sched.monotonic(self.actor)

    def sleep(self, seconds: float) -> None:
        """Let others run for ``seconds`` of simulated time."""
        self.sched.sleep(self.actor, seconds)


class Scheduler:
    """Hands the baton to one actor at a time; owns simulated time."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.actors: dict[str, Actor] = {}
        self.current: Actor | None = None
        self.turns = 0
        self._back = threading.Semaphore(0)

    # -- clocks --------------------------------------------------------------------------

    def broker_now(self) -> datetime:
        """The broker's clock (the reference every invariant goes by)."""
        return EPOCH + timedelta(milliseconds=self.now_ms)

    def wall(self, actor: Actor) -> datetime:
        """An actor's wall clock, read at a crossing."""
        self.point(actor)
        return EPOCH + timedelta(milliseconds=self.now_ms + actor.skew_ms)

    def monotonic(self, actor: Actor) -> float:
        """An actor's monotonic clock (seconds), read at a crossing."""
        self.point(actor)
        return self.now_ms / 1000.0

    def sleep(self, actor: Actor, seconds: float) -> None:
        """Let the actor wait ``seconds`` of simulated time (others run meanwhile)."""
        actor.wake_ms = self.now_ms + max(1, int(seconds * 1000))
        actor.state = ActorState.SLEEPING
        self.point(actor)

    # -- actors --------------------------------------------------------------------------

    def add(self, actor: Actor) -> Actor:
        """Register an actor; it first runs when the scheduler picks it."""
        if actor.name in self.actors:
            raise ValueError(f"two actors named {actor.name!r}")
        self.actors[actor.name] = actor
        return actor

    def point(self, actor: Actor) -> None:
        """A boundary crossing: hand the baton back and wait to be picked again."""
        if self.current is not actor:
            raise RuntimeError(f"{actor.name} crossed a boundary while {self._who()} runs")
        if actor._killed:
            raise Killed(actor.name)
        actor.crossings += 1
        self._back.release()
        actor._baton.acquire()
        if actor._killed:
            raise Killed(actor.name)

    def _who(self) -> str:
        return "nobody" if self.current is None else self.current.name

    def run_turn(self, actor: Actor) -> None:
        """Let one actor run up to its next crossing (or its end)."""
        self.current = actor
        if actor._thread is None:
            actor._thread = threading.Thread(
                target=self._main, args=(actor,), name=f"sim-{actor.name}", daemon=True
            )
            actor._thread.start()
        else:
            actor._baton.release()
        if not self._back.acquire(timeout=STUCK_S):
            raise RuntimeError(f"actor {actor.name} did not reach a crossing in {STUCK_S:g}s")
        self.current = None
        self.turns += 1

    def _main(self, actor: Actor) -> None:
        try:
            actor.body(actor)
            if not actor.ended:
                actor.ended = "done"
        except Killed:
            actor.ended = actor.ended or "killed"
        except BaseException as exc:
            import traceback

            actor.crash = "".join(traceback.format_exception(exc)).strip()
            actor.ended = f"crashed: {type(exc).__name__}: {exc}"
        finally:
            if actor.state is not ActorState.KILLED:
                actor.state = ActorState.DONE
            self._back.release()

    def kill(self, actor: Actor) -> None:
        """Kill an actor: it never runs again; its thread unwinds before this returns."""
        if not actor.live:
            return
        actor.state = ActorState.KILLED
        actor._killed = True
        actor.ended = actor.ended or "killed"
        thread = actor._thread
        if thread is None:
            return
        self.current = actor
        actor._baton.release()
        # Its unwinding may cross boundaries (each raises Killed at once) but never blocks.
        if not self._back.acquire(timeout=STUCK_S):
            raise RuntimeError(f"killed actor {actor.name} did not unwind")
        thread.join(timeout=STUCK_S)
        self.current = None

    def ready(self) -> list[Actor]:
        """Actors that may run now (sleepers and frozen ones whose time came are woken)."""
        found = []
        for actor in self.actors.values():
            woken = actor.state is ActorState.SLEEPING and actor.wake_ms <= self.now_ms
            thawed = actor.state is ActorState.FROZEN and actor.thaw_ms <= self.now_ms
            if woken or thawed:
                actor.state = ActorState.READY
            if actor.state is ActorState.READY:
                found.append(actor)
        return found

    def next_wake(self) -> int | None:
        """The earliest time a sleeping or frozen actor is ready again."""
        times = [
            a.wake_ms if a.state is ActorState.SLEEPING else a.thaw_ms
            for a in self.actors.values()
            if a.state in (ActorState.SLEEPING, ActorState.FROZEN)
        ]
        return min(times, default=None)

    def close(self) -> None:
        """Kill every actor still alive, so no thread outlives the run."""
        for actor in list(self.actors.values()):
            if actor._thread is not None and actor._thread.is_alive():
                actor.state = ActorState.READY  # let kill() treat it as live
                self.kill(actor)

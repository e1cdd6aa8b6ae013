"""The recovery daemon's waits run on a clock that never steps (DESIGN invariant 15).

Found by the simulator: a daemon whose wall clock stepped forward (an NTP correction, a VM
resumed) decided early.  Its arrivals and due times were on that wall clock, and its lead
over the broker was the least of its recent samples, taken before the step: a deadline
anchored from either passed by as much as the step.  Now arrivals, lead samples and every
comparison with a due time run on the wall clock at start plus the monotonic time since
(``recovery.clock.SteadyClock``); the wall clock stays for the timestamps it writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Found, Tool
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.clock import LOG_APPEND_TIME, SteadyClock
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.unit.daemon_loop import hold_partition
from tests.unit.factories import T0

TIMEOUT_S = 2.0
GRACE = timedelta(seconds=0.5)
STEP = timedelta(seconds=3)
PAY = Tool(
    name="pay",
    keyed=True,
    policy="query",
    timeout_s=TIMEOUT_S,
    query=lambda args, key: Found({"paid": key}),
)


class Wall:
    """A wall clock the test moves, and steps."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Monotonic:
    """A monotonic clock the test moves (a Timer)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Host:
    """The daemon's two clocks: time passing moves both; a step moves the wall clock only."""

    def __init__(self) -> None:
        self.wall, self.timer = Wall(), Monotonic()

    def passes(self, delta: timedelta) -> None:
        self.wall.now += delta
        self.timer.now += delta.total_seconds()

    def steps(self, delta: timedelta) -> None:
        self.wall.now += delta


def test_the_steady_clock_starts_at_the_wall_and_moves_with_the_monotonic_clock_only() -> None:
    host = Host()
    steady = SteadyClock(host.wall, host.timer)
    assert steady() == T0
    host.steps(STEP)
    assert steady() == T0  # a step of the wall clock moves nothing
    host.passes(timedelta(seconds=1))
    assert steady() == T0 + timedelta(seconds=1)
    host.steps(-2 * STEP)
    assert steady() == T0 + timedelta(seconds=1)  # nor does a step back


def _daemon(tmp_path: Path, host: Host, log: InMemoryEventLog) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([PAY]),
        DaemonOptions(state_dir=tmp_path, workers=1, grace_s=GRACE.total_seconds()),
        log=log,
        store=InMemoryCheckpointStore(),
        dead_letters=MemoryEventLetters(),
        clock=host.wall,
        timer=host.timer,
    )
    return hold_partition(daemon)


def _decided(daemon: RecoveryDaemon, log: InMemoryEventLog) -> list[str]:
    daemon.fence.polled()
    daemon._dispatch()
    daemon._collect(wait=5.0)
    return [e.type for e in log.workflow_events("wf")]


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _read(daemon: RecoveryDaemon, offset: int, event: ev.Event, stamped: datetime | None) -> None:
    timestamp = (0, -1) if stamped is None else (LOG_APPEND_TIME, _millis(stamped))
    daemon._handle(Consumed("log", 0, offset, None, Codec().encode(event), timestamp=timestamp))


@pytest.mark.parametrize("stamped", [False, True], ids=["read-time", "broker-time"])
@pytest.mark.parametrize("stepped", ["before-the-intent", "after-the-intent"])
def test_a_wall_clock_stepped_forward_decides_nothing_early(
    tmp_path: Path, stamped: bool, stepped: str
) -> None:
    host, log = Host(), InMemoryEventLog()
    daemon = _daemon(tmp_path, host, log)
    agent = EventFactory("fleet", "agent", lambda: T0)
    opened = agent.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=3)
    # A broker-stamped record read at once teaches the daemon its lead over the broker (0).
    _read(daemon, 0, opened, T0 if stamped else None)
    if stepped == "before-the-intent":
        host.steps(STEP)  # the least lead of its samples is from before the step
    host.passes(timedelta(milliseconds=1))
    intent = agent.intent("wf", "s", PAY, {"n": 1}, sequence=0)
    log.append(opened)
    log.append(intent)
    _read(daemon, 1, intent, T0 + timedelta(milliseconds=1) if stamped else None)
    if stepped == "after-the-intent":
        host.steps(STEP)  # the intent's arrival is from before the step
    # Due its timeout plus the grace after it was appended, as time passes: not earlier.
    host.passes(timedelta(seconds=TIMEOUT_S) + GRACE - timedelta(milliseconds=1))
    assert _decided(daemon, log) == ["workflow_started", "step_intended"]
    host.passes(timedelta(milliseconds=1))
    assert _decided(daemon, log)[-1] == "step_outcome"  # found by its query, in time
    daemon.work.shutdown(wait=True)


def test_the_decisions_timestamps_are_on_the_wall_clock(tmp_path: Path) -> None:
    host, log = Host(), InMemoryEventLog()
    daemon = _daemon(tmp_path, host, log)
    agent = EventFactory("fleet", "agent", lambda: T0)
    intent = agent.intent("wf", "s", PAY, {"n": 1}, sequence=0)
    log.append(intent)
    _read(daemon, 0, intent, None)
    host.steps(STEP)
    host.passes(timedelta(seconds=TIMEOUT_S) + GRACE)
    _decided(daemon, log)
    decided = log.workflow_events("wf")[-1]
    assert decided.type == "step_outcome" and decided.occurred_at == host.wall.now
    daemon.work.shutdown(wait=True)

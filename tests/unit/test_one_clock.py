"""One clock for deadlines: a step is due its timeout plus the grace after it reached the
decider, on the decider's clock, whatever its writer's clock said (DESIGN invariant 15).

A writer's clock that runs ahead must not hold a decision back (liveness); one that runs
behind must not let it come early (safety).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, ResolutionPolicy, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Found, Tool
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger
from stepledger.producer.settling import Arrivals
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.clock import LOG_APPEND_TIME
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.simulate import defects
from tests.unit.daemon_loop import hold_partition
from tests.unit.factories import T0
from tests.unit.resume_fakes import Crash, World, crash_after

TIMEOUT_S = 2.0
GRACE = timedelta(seconds=0.5)
PAY = Tool(
    name="pay",
    keyed=True,
    policy="query",
    timeout_s=TIMEOUT_S,
    query=lambda args, key: Found({"paid": key}),
    compensate=lambda args, key, known: {"refunded": key},
)
SKEWS = [-120.0, 0.0, 120.0]


def writer(skew_s: float) -> EventFactory:
    """Events of an agent whose wall clock is ``skew_s`` off the decider's (T0 on it)."""
    return EventFactory("fleet", f"agent{skew_s:+.0f}", lambda: T0 + timedelta(seconds=skew_s))


def intended(skew_s: float) -> ev.Event:
    return writer(skew_s).intent("wf", "s", PAY, {"n": 1}, sequence=0)


# -- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", SKEWS)
def test_an_intent_is_due_its_timeout_plus_grace_after_it_arrived_whatever_its_clock(
    skew_s: float,
) -> None:
    step = replay("wf", [intended(skew_s)]).steps["s"]
    arrived = T0 + timedelta(seconds=0.01)  # read 10 ms after it was written
    due = rs.due_at(step, PAY, grace=GRACE, arrival=rs.Arrival(arrived, arrived))
    assert due == arrived + timedelta(seconds=TIMEOUT_S) + GRACE
    before = rs.decide(
        step,
        PAY,
        now=due - timedelta(milliseconds=1),
        grace=GRACE,
        arrival=rs.Arrival(arrived, arrived),
    )
    assert before.kind is rs.ActionKind.WAIT
    at = rs.decide(step, PAY, now=due, grace=GRACE, arrival=rs.Arrival(arrived, arrived))
    assert at.kind is rs.ActionKind.QUERY
    # Without an arrival the writer's recorded deadline decides, skew and all.
    recorded = rs.due_at(step, PAY, grace=GRACE)
    assert recorded == T0 + timedelta(seconds=skew_s + TIMEOUT_S) + GRACE


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_compensation_and_a_back_off_run_from_their_last_events_arrival(
    skew_s: float,
) -> None:
    agent, intent = writer(skew_s), intended(skew_s)
    assert isinstance(intent.body, ev.StepIntended)
    failed = ev.ResolutionAttempted(policy=ResolutionPolicy.QUERY, attempt=1, error="timed out")
    tried = agent.envelope("wf", "s", failed)
    undo = ev.CompensationIntended(  # a resuming agent's recovery compensation, on its clock
        idempotency_key=ids.compensation_key(intent.body.idempotency_key),
        reason="in doubt",
        source=Source.RECOVERY_COMPENSATE,
        deadline=T0 + timedelta(seconds=skew_s + TIMEOUT_S),
        attempt=1,
    )
    compensating = agent.envelope("wf", "s", undo)
    arrived = T0 + timedelta(seconds=1)
    arrival = rs.Arrival(T0, arrived)
    retried = replay("wf", [intent, tried]).steps["s"]
    backoff = rs.retry_delay(1, PAY, 0.25)
    assert rs.due_at(retried, PAY, grace=GRACE, arrival=arrival) == max(
        T0 + timedelta(seconds=TIMEOUT_S) + GRACE, arrived + backoff
    )
    undoing = replay("wf", [intent, compensating]).steps["s"]
    assert undoing.status is StepStatus.COMPENSATING
    assert rs.due_at(undoing, PAY, grace=GRACE, arrival=arrival) == (
        arrived + timedelta(seconds=TIMEOUT_S) + GRACE
    )


def test_a_resuming_agent_takes_its_own_time_for_an_event_recorded_after_it_held_it() -> None:
    now = [T0]
    arrivals = Arrivals(lambda: now[0])
    ahead = replay("wf", [intended(120.0)]).steps["s"]
    behind = replay("wf", [intended(-120.0)]).steps["s"]
    assert arrivals.of(ahead) == rs.Arrival(T0, T0)  # recorded 120 s after it was held
    now[0] += timedelta(seconds=30)
    assert arrivals.of(ahead) == rs.Arrival(T0, T0)  # held once: the first sighting stands
    late = T0 - timedelta(seconds=120)
    assert arrivals.of(behind) == rs.Arrival(late, late)  # the recorded time is earlier


# -- the daemon (injected clock) --------------------------------------------------------------


class DaemonClock:
    """The daemon's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _daemon(tmp_path: Path, clock: DaemonClock, log: InMemoryEventLog) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([PAY]),
        DaemonOptions(state_dir=tmp_path, workers=1, grace_s=GRACE.total_seconds()),
        log=log,
        store=InMemoryCheckpointStore(),
        dead_letters=MemoryEventLetters(),
        clock=clock,
    )
    return hold_partition(daemon)


def _decided(daemon: RecoveryDaemon, log: InMemoryEventLog) -> list[str]:
    daemon._dispatch()
    daemon._collect(wait=5.0)
    return [e.type for e in log.workflow_events("wf")]


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@pytest.mark.parametrize("stamped", [False, True], ids=["read-time", "broker-time"])
@pytest.mark.parametrize("skew_s", SKEWS)
def test_the_daemon_decides_an_intent_its_timeout_plus_grace_after_the_append(
    tmp_path: Path, skew_s: float, stamped: bool
) -> None:
    clock, log = DaemonClock(), InMemoryEventLog()
    daemon = _daemon(tmp_path, clock, log)
    timestamp, appended = (0, -1), T0 + timedelta(milliseconds=2)  # the read time stands in
    if stamped:
        # A fresh record teaches the daemon its lead over the broker (-3 ms: it runs behind);
        # the intent, stamped 1 ms after it, was appended at T0 + 1 ms on the daemon's clock.
        daemon.deadlines.observe((LOG_APPEND_TIME, _millis(T0 + timedelta(milliseconds=3))), T0)
        timestamp = (LOG_APPEND_TIME, _millis(T0 + timedelta(milliseconds=4)))
        appended = T0 + timedelta(milliseconds=1)
    clock.now = T0 + timedelta(milliseconds=2)
    value = Codec().encode(intended(skew_s))
    daemon._handle(Consumed("log", 0, 0, None, value, timestamp=timestamp))
    due = appended + timedelta(seconds=TIMEOUT_S) + GRACE
    clock.now = due - timedelta(milliseconds=1)
    assert _decided(daemon, log) == [], "decided before the deadline by the agent's clock"
    clock.now = due
    upcoming = daemon.tracker.next_due()
    assert upcoming is not None and upcoming <= due
    types = _decided(daemon, log)
    assert types[-1] == "step_outcome", types  # found by its query, not held by the skew
    outcome = log.workflow_events("wf")[-1].body
    assert isinstance(outcome, ev.StepOutcome) and outcome.status is OutcomeStatus.SUCCEEDED
    daemon.work.shutdown(wait=True)


def test_a_step_taken_over_from_a_checkpoint_is_due_its_timeout_after_the_take_over(
    tmp_path: Path,
) -> None:
    store, log = InMemoryCheckpointStore(), InMemoryEventLog()
    first_clock = DaemonClock()
    first = _daemon(tmp_path, first_clock, log)
    first.store = store
    opened = writer(120.0).workflow_started(
        "wf", name="", attempt=1, read_only=False, max_attempts=3
    )
    for offset, event in enumerate([opened, intended(120.0)]):
        first._handle(Consumed("log", 0, offset, None, Codec().encode(event)))
    first.checkpoint()
    clock = DaemonClock()
    clock.now = T0 + timedelta(minutes=1)  # before the deadline the fast agent recorded
    owner = _daemon(tmp_path, clock, log)
    owner.store = store
    owner._on_assign([])
    owner.tracker.load(0, store.load("log", 0), clock.now)
    due = clock.now + timedelta(seconds=TIMEOUT_S) + GRACE
    assert owner.tracker.due(due - timedelta(milliseconds=1), 10, {0}) == []
    assert owner.tracker.due(due, 10, {0}) == [("wf", "s")]
    first.work.shutdown(wait=True)
    owner.work.shutdown(wait=True)


@pytest.mark.parametrize("switch", [(), ("refused_event_waits",)], ids=["fixed", "reverted"])
def test_an_event_the_fold_refused_does_not_hold_a_compensation_back(
    tmp_path: Path, switch: tuple[str, ...]
) -> None:
    # Found by the simulator (seed 120): the daemon's compensation claim, then the frozen
    # runner's late "succeeded" outcome (a conflict the fold refuses) a second later.
    clock, log = DaemonClock(), InMemoryEventLog()
    intent = intended(0.0)
    assert isinstance(intent.body, ev.StepIntended)
    undo = ev.CompensationIntended(
        idempotency_key=ids.compensation_key(intent.body.idempotency_key),
        reason="in doubt",
        source=Source.RECOVERY_COMPENSATE,
        deadline=T0 + timedelta(seconds=2.5 + TIMEOUT_S),
        attempt=1,
    )
    daemon_events = EventFactory("fleet", "recovery", lambda: clock.now)
    late = writer(0.0).outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED)
    events = [(intent, 0.0), (daemon_events.envelope("wf", "s", undo), 2.5), (late, 3.5)]
    with defects.switched(switch):
        daemon = _daemon(tmp_path, clock, log)
        for offset, (event, at) in enumerate(events):
            clock.now = T0 + timedelta(seconds=at)
            daemon._handle(Consumed("log", 0, offset, None, Codec().encode(event)))
        tracked = daemon.tracker.steps[("wf", "s")]
        daemon.work.shutdown(wait=True)
    state = replay("wf", [e for e, _ in events])
    assert state.steps["s"].status is StepStatus.COMPENSATING
    assert [a.kind for a in state.anomalies] == ["late_outcome"], state.anomalies
    # The compensation's timeout and the grace run from its claim, not from the refused event.
    claimed = T0 + timedelta(seconds=2.5 + TIMEOUT_S) + GRACE
    refused = T0 + timedelta(seconds=3.5 + TIMEOUT_S) + GRACE
    assert tracked.due == (refused if switch else claimed)


# -- a resuming agent (real time) --------------------------------------------------------------


def real_clock(skew_s: float) -> Callable[[], datetime]:
    """A wall clock that moves with real time, ``skew_s`` off."""
    start = time.monotonic()
    return lambda: T0 + timedelta(seconds=skew_s + time.monotonic() - start)


def test_a_resuming_agent_decides_a_step_whose_writers_clock_ran_ahead_in_time() -> None:
    world = World(resolve_timeout_s=10.0)
    charge = world.services.charge  # keyed, queried: "not found" lets the resume charge once

    def process(skew_s: float) -> Ledger:
        return Ledger(
            Settings(fleet_id="fleet", producer_id=f"agent{skew_s:+.0f}"),
            log=world.log,
            clock=real_clock(skew_s),
            tools=world.services.tools(),
            dead_letters=world.dead_letters,
            options=world.options,
        )

    with pytest.raises(Crash):
        process(120.0).workflow("wf").step(
            "charge", charge, {"amount": 5}, crash_after(charge, effect=False)
        )
    began = time.monotonic()
    result = process(0.0).workflow("wf").step("charge", charge, {"amount": 5})
    took = time.monotonic() - began
    assert result["amount"] == 5 and world.services.effects["charge"] == 1
    # Due its timeout plus the grace after the resume read it, not 120 s on.
    assert took < charge.timeout_s + 3.0, took
    step = replay("wf", world.log.workflow_events("wf")).steps["charge"]
    assert step.status is StepStatus.SUCCEEDED

"""A resuming agent's one clock: the broker's append times, read through its history and
taken to its own clock (``stepledger.history.clock``), as the recovery daemon takes them.

The writer's recorded times never decide when the broker's are known: a writer whose clock
runs behind the resuming agent's would otherwise have its step settled early.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import ResolutionPolicy
from stepledger.domain.state import replay
from stepledger.history.clock import LOG_APPEND_TIME, AppendClock
from stepledger.producer.settling import Arrivals
from tests.unit.factories import T0
from tests.unit.test_one_clock import PAY, TIMEOUT_S, intended, writer

CREATE_TIME = 1


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_read_takes_each_broker_time_to_the_readers_clock_by_its_freshest_record() -> None:
    clock = AppendClock()
    read_at = T0 + timedelta(seconds=100)  # the reader's clock runs 100 s ahead of the broker
    old, fresh = T0 - timedelta(seconds=30), T0 - timedelta(milliseconds=2)
    stamps = [
        ("intent", (LOG_APPEND_TIME, _ms(old))),
        ("claim", (LOG_APPEND_TIME, _ms(fresh))),  # just landed: bounds the lead to 100.002 s
        ("foreign", (CREATE_TIME, _ms(T0))),  # a producer's own time decides nothing
        ("intent", (LOG_APPEND_TIME, _ms(fresh))),  # a duplicate: its first append counts
    ]
    appended = clock.read(stamps, read_at)
    lead = timedelta(seconds=100.002)
    assert appended == {"intent": old + lead, "claim": read_at}
    assert clock.least_lead() == pytest.approx(lead.total_seconds())


def test_a_step_arrives_with_its_latest_intent_and_its_latest_event() -> None:
    intent = intended(-120.0)
    tried = writer(-120.0).envelope(
        "wf", "s", ev.ResolutionAttempted(policy=ResolutionPolicy.QUERY, attempt=1, error="x")
    )
    first, second = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)
    both = {intent.event_id: first, tried.event_id: second}
    assert rs.step_arrivals([intent, tried], both) == {"s": rs.Arrival(first, second)}
    # An event the fold refused begins no wait, as for the daemon.
    refused = {tried.event_id}
    assert rs.step_arrivals([intent, tried], both, refused) == {"s": rs.Arrival(first, first)}
    # The latest event's time not known: no arrival (the recorded times then decide).
    assert rs.step_arrivals([intent, tried], {intent.event_id: first}) == {}


def test_a_resuming_agent_goes_by_the_brokers_times_while_the_step_is_as_read() -> None:
    now = [T0]
    behind = replay("wf", [intended(-120.0)]).steps["s"]  # the writer's clock 120 s behind
    appended = T0 - timedelta(seconds=1)  # by the broker, on this agent's clock
    read = {"s": (behind, rs.Arrival(appended, appended))}
    arrivals = Arrivals(lambda: now[0], lambda: read)
    assert arrivals.of(behind) == rs.Arrival(appended, appended)
    due = rs.due_at(behind, PAY, grace=timedelta(0), arrival=arrivals.of(behind))
    assert due == appended + timedelta(seconds=TIMEOUT_S)  # not 120 s early
    # An event folded since that read (no time for it): the recorded times stand again.
    later = replay("wf", [intended(-120.0)]).steps["s"]
    moved = type(later)(**{**later.__dict__, "recovery_attempts": 1})
    recorded = T0 - timedelta(seconds=120)
    assert arrivals.of(moved).intent == recorded


def test_an_empty_history_answer_knows_no_time() -> None:
    assert AppendClock().read([], datetime(2026, 1, 1, tzinfo=UTC)) == {}

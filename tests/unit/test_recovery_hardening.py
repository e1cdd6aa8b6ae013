"""Recovery's pure parts against hostile values: bounded times, poison intents, fencing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import KafkaError

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.times import LATEST, later, seconds
from stepledger.errors import OwnershipLostError
from stepledger.kafka.fence import Fence
from stepledger.kafka.watch import BrokerWatch, RateLimit
from stepledger.log import InMemoryEventLog
from stepledger.recovery.fence import FencedLog
from stepledger.recovery.tracker import Tracker
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver
from tests.unit.factories import T0, factory, pay_tool

FAR = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_sums_saturate_instead_of_overflowing() -> None:
    assert later(FAR, timedelta(seconds=2)) == LATEST
    assert later(T0, timedelta(seconds=2)) == T0 + timedelta(seconds=2)
    assert seconds(1e300) == timedelta.max
    assert rs.retry_delay(10**9, None, 0.25) == timedelta(seconds=60)


def test_a_far_future_deadline_is_scheduled_never_and_raises_nothing() -> None:
    f = factory()
    tool = pay_tool()
    intent = f.intent("wf", "s", tool, {}, sequence=0)
    body = intent.body.model_copy(update={"deadline": FAR})
    state = replay("wf", [intent.model_copy(update={"body": body})])
    step = state.steps["s"]
    assert rs.due_at(step, tool, grace=timedelta(hours=1)) == LATEST
    assert rs.decide(step, tool, now=T0, grace=timedelta(hours=1)).kind is rs.ActionKind.WAIT
    tracker = Tracker(lambda s, a: rs.due_at(s, tool, grace=timedelta(hours=1), arrival=a))
    tracker.apply(intent.model_copy(update={"body": body}), 0, 0)
    assert tracker.due(T0, 10, {0}) == []


def test_a_workflow_restart_carrying_a_steps_id_untracks_the_step() -> None:
    f = factory()
    tool = pay_tool()
    tracker = Tracker(lambda s, a: rs.due_at(s, tool, grace=timedelta(0), arrival=a))
    tracker.apply(f.intent("wf", "s", tool, {}, sequence=0), 0, 0)
    restart = f.workflow_started("wf", name="", attempt=2, read_only=True, max_attempts=3)
    tracker.apply(restart.model_copy(update={"step_id": "s"}), 0, 1)
    assert ("wf", "s") not in tracker.steps
    batch = tracker.take_batch(T0)
    assert (0, "wf", "s") in batch.deletes and tracker.positions[0] == 2


def test_an_intent_whose_arguments_are_not_json_counts_attempts_and_is_abandoned() -> None:
    f = factory()
    tool = pay_tool()
    intent = f.intent("wf", "s", tool, {}, sequence=0)
    body = intent.body.model_copy(update={"arguments_json": "{not json"})
    log = InMemoryEventLog()
    resolver = Resolver(log, f, ToolRegistry([tool]), clock=lambda: FAR - timedelta(days=1))
    state = replay("wf", [intent.model_copy(update={"body": body})])
    for attempt in range(1, tool.max_attempts + 1):
        resolution = resolver.attempt(state, "s")
        assert resolution.error is not None and "JSONDecodeError" in resolution.error
        assert state.steps["s"].recovery_attempts == attempt
    final = resolver.attempt(state, "s")
    assert final.action.kind is rs.ActionKind.GIVE_UP
    assert state.steps["s"].status is StepStatus.ABANDONED
    assert any(isinstance(e.body, ev.StepAbandoned) for e in log.workflow_events("wf"))


def test_the_fence_trusts_ownership_only_while_the_loop_polls() -> None:
    ticks = Ticks()
    fence = Fence(session_s=6.0, heartbeat_s=0.5, clock=ticks)
    fence.assigned({0, 1})
    fence.polled()
    assert fence.owns(0) and not fence.owns(2)
    ticks.now += 7.0  # paused past the session: nothing polled
    assert not fence.owns(0)
    fence.polled()  # woke up: suspect until the group had time to answer
    assert not fence.owns(0)
    ticks.now += 1.6
    fence.polled()
    assert fence.owns(0)
    fence.revoked({0})
    assert not fence.owns(0) and fence.owns(1)


def test_a_fenced_log_refuses_appends_for_a_partition_no_longer_owned() -> None:
    ticks = Ticks()
    fence = Fence(session_s=6.0, heartbeat_s=0.5, clock=ticks)
    fence.assigned({3})
    fence.polled()
    log = FencedLog(InMemoryEventLog(), fence)
    event = factory().workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=3)
    fence.working_on(3)
    log.append(event)
    fence.revoked({3})
    with pytest.raises(OwnershipLostError, match="partition 3"):
        log.append(event)
    fence.working_on(None)
    log.append(event)  # not a worker's append: not fenced


def test_a_broker_outage_is_two_lines_and_a_gauge(caplog: pytest.LogCaptureFixture) -> None:
    ticks = Ticks()
    changes: list[bool] = []
    watch = BrokerWatch(logging.getLogger("t.watch"), on_change=changes.append, clock=ticks)
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "all brokers down")
    with caplog.at_level(logging.INFO, logger="t.watch"):
        for _ in range(300):
            watch.on_error(down)
        assert watch.should_probe() and not watch.should_probe()
        ticks.now += 15
        watch.reachable()
        watch.reachable()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["broker unreachable", "broker reachable again after 15.0s"]
    assert changes == [False, True] and watch.outages == 1


def test_repeated_client_log_lines_are_rate_limited() -> None:
    ticks = Ticks()
    limit = RateLimit(every_s=30, clock=ticks)
    record = logging.LogRecord("k", logging.ERROR, "", 0, "FAIL connect refused", None, None)
    passed = [limit.filter(record) for _ in range(100)]
    ticks.now += 31
    assert passed.count(True) == 1 and limit.filter(record)

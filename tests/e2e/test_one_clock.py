"""One clock for deadlines: an agent's clock 120 s off the recovery daemon's changes nothing.

The agent's step is slow but inside its deadline by the agent's own clock; the daemon
(``stepledger recover`` subprocess) reads the intent at once.  Whatever the skew, the daemon
makes no decision on the step: its deadline is re-anchored on the daemon's clock (on a step
log stamped by the broker, ``LogAppendTime``, from the record's broker time).  And whatever
the skew, an agent that dies inside the call has its step decided within the timeout plus
the grace of its intent's append, not when the agent's clock says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from stepledger.config import Settings
from stepledger.domain.enums import Source
from stepledger.domain.factory import utc_now
from stepledger.domain.state import StepStatus, replay
from stepledger.kafka import admin, ensure_topics
from stepledger.producer import Ledger
from stepledger_dev.examples.clients import _JsonClient
from stepledger_dev.examples.tools import BOOKINGS, make_registry
from tests.conftest import unique
from tests.e2e.recovery_helpers import GRACE_S, Stack, read_events, services_stack, wait_for

pytestmark = pytest.mark.e2e
TIMEOUT_S = 3.0
CALL_S = 1.2
BOOKING = {"hotel": "Hotel Lisboa", "nights": 2}


@pytest.fixture(scope="module")
def clock_settings(bootstrap: str) -> Settings:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("events"),
        dlq_topic=unique("dlq"),
        fleet_id="clock-fleet",
        producer_id="skewed",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    return settings


@pytest.fixture(scope="module")
def stack(clock_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("one-clock")
    with services_stack(base) as stack:
        stack.start_daemon(clock_settings, base / "state")
        yield stack


@pytest.mark.parametrize("skew_s", [-120.0, 120.0])
def test_no_decision_on_a_call_inside_its_deadline_by_the_agents_clock(
    stack: Stack, clock_settings: Settings, skew_s: float
) -> None:
    slow_step_decides_nothing(stack, clock_settings, skew_s)


@pytest.mark.kafka_only
def test_on_a_broker_stamped_log_the_skew_is_measured_and_nothing_decided_early(
    bootstrap: str, tmp_path: Path
) -> None:
    settings = Settings(
        bootstrap=bootstrap,
        topic=unique("events"),
        dlq_topic=unique("dlq"),
        fleet_id="clock-fleet",
        producer_id="behind",
    )
    stamped = {"message.timestamp.type": "LogAppendTime"}
    topics = [NewTopic(settings.topic, 3, config=stamped), NewTopic(settings.dlq_topic, 3)]
    client = admin(settings)
    for future in client.create_topics(topics).values():
        future.result(10)
    with services_stack(tmp_path) as stack:
        log = tmp_path / "recovery.log"
        stack.start_daemon(settings, tmp_path / "state", log=log)
        slow_step_decides_nothing(stack, settings, -120.0)
        assert "producer behind: clock -12" in log.read_text()  # one line, broker-stamped


@pytest.mark.parametrize("skew_s", [-120.0, 120.0])
def test_a_step_left_in_doubt_is_decided_within_its_deadline_plus_grace_whatever_the_skew(
    stack: Stack, clock_settings: Settings, skew_s: float
) -> None:
    tools = make_registry(bookings_url=stack.services["bookings"].url, timeout_s=TIMEOUT_S)
    book = tools.require(BOOKINGS)

    def dies(args: dict[str, Any], key: str) -> Any:
        raise Died  # the process dies inside the call: the intent stays in doubt

    workflow = unique("wf-skew-dies")
    skewed = Ledger(
        clock_settings, tools=tools, clock=lambda: utc_now() + timedelta(seconds=skew_s)
    )
    with skewed as ledger, pytest.raises(Died):
        ledger.workflow(workflow).step("s", book, BOOKING, dies)
    appended = time.monotonic()

    def decided() -> bool:
        events = [e for e in read_events(clock_settings) if e.workflow_id == workflow]
        return replay(workflow, events).steps["s"].status is not StepStatus.INTENDED

    # Bounded well below the skew: a daemon that waited on the agent's clock misses it.
    wait_for(decided, TIMEOUT_S + GRACE_S + 20.0, "the daemon to decide the step")
    assert time.monotonic() - appended < TIMEOUT_S + GRACE_S + 20.0


class Died(BaseException):
    """Stands for a SIGKILL inside a call: no outcome is recorded."""


def slow_step_decides_nothing(stack: Stack, clock_settings: Settings, skew_s: float) -> None:
    """A slow step of an agent whose clock is ``skew_s`` off: the daemon decides nothing."""
    tools = make_registry(bookings_url=stack.services["bookings"].url, timeout_s=TIMEOUT_S)
    book = tools.require(BOOKINGS)
    assert book.run is not None
    run = book.run

    def slow_book(args: dict[str, Any], key: str) -> Any:
        time.sleep(CALL_S)  # the call is slow, well inside its timeout
        return run(args, key)

    workflow = unique("wf-skew")
    began = time.monotonic()
    skewed = Ledger(
        clock_settings, tools=tools, clock=lambda: utc_now() + timedelta(seconds=skew_s)
    )
    with skewed as ledger:
        wf = ledger.workflow(workflow)
        result = wf.step("s", book, BOOKING, slow_book)
        assert result["status"] == "confirmed"
    # Absence of a decision cannot be polled for: wait past the latest moment the daemon
    # could decide (the deadline re-anchored on its clock plus grace), then read the log.
    time.sleep(max(0.0, began + TIMEOUT_S + GRACE_S + 1.5 - time.monotonic()))
    events = [e for e in read_events(clock_settings) if e.workflow_id == workflow]
    by_recovery = [
        e.type for e in events if getattr(e.body, "source", Source.AGENT) != Source.AGENT
    ]
    assert by_recovery == [], by_recovery
    state = replay(workflow, events)
    assert state.steps["s"].status is StepStatus.SUCCEEDED and not state.anomalies
    client = _JsonClient(stack.services["bookings"].url)
    key = state.steps["s"].idempotency_key
    assert client.effect_count("booking", key) == 1
    assert client.effect_count("cancel", key) == 0

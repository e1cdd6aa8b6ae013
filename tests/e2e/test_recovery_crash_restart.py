"""The daemon itself crashes or runs in a pair; a hook that always fails is dead-lettered."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.deadletters.letter import dead_letter_info
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus
from stepledger.kafka import DurableProducer
from stepledger.kafka.reader import Record, read_topic
from stepledger.log import KafkaEventLog, codec_for
from stepledger_dev.broker import free_port
from stepledger_dev.examples.clients import _JsonClient
from stepledger_dev.examples.tools import BOOKINGS, PAYMENTS, payments_tool
from tests.conftest import Factory
from tests.e2e.recovery_helpers import LogWatcher, Stack, services_stack, stop, wait_for

pytestmark = pytest.mark.e2e
CHARGE = {"amount": 700, "currency": "EUR", "customer": "cus_2"}
BOOKING = {"hotel": "Hotel Porto", "nights": 1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with services_stack(tmp_path_factory.mktemp("recovery-restart")) as stack:
        yield stack


def health(state_dir: Path) -> dict[str, object]:
    """The health file of the one daemon that uses this state dir."""
    files = list(state_dir.glob("health-*.json"))
    return dict(json.loads(files[0].read_text())) if files else {"partitions": []}


def count(stack: Stack, service: str, kind: str, key: str) -> int:
    return _JsonClient(stack.services[service].url).effect_count(kind, key)


def test_hook_that_always_fails_stops_at_max_attempts_and_is_dead_lettered(
    stack: Stack, settings: Settings, tmp_path: Path
) -> None:
    # The daemon's payments URL leads nowhere: every query fails at once.
    dead = f"http://127.0.0.1:{free_port()}"
    stack.start_daemon(settings, tmp_path / "state", STEPLEDGER_PAYMENTS_URL=dead)
    workflow = "wf-" + uuid.uuid4().hex[:8]
    agent = stack.run_agent(settings, PAYMENTS, workflow, "s", CHARGE, kill="after_intent")
    assert agent.returncode == -9
    watcher = LogWatcher(settings)
    try:

        def abandoned() -> bool:
            step = watcher.step(workflow)
            return step is not None and step.status is StepStatus.ABANDONED

        wait_for(abandoned, 15, "the step to be abandoned after its attempts")
        events = watcher.of(workflow)
    finally:
        watcher.close()
    tries = [e.body for e in events if isinstance(e.body, ev.ResolutionAttempted)]
    assert [t.attempt for t in tries] == [1, 2, 3]
    assert all(t.error and "ToolServiceError" in t.error for t in tries)
    [abandonment] = [e for e in events if isinstance(e.body, ev.StepAbandoned)]
    assert isinstance(abandonment.body, ev.StepAbandoned)
    assert "3 recovery attempts failed" in abandonment.body.reason

    def letters() -> list[Record] | None:
        # A read that stops after 0.2 s without a record found none on a busy machine (a
        # new consumer's first fetch came later): read again until the letter is there.
        dlq = settings.dlq_topic
        return list(read_topic(settings, codec_for(settings), topic=dlq, idle_timeout=0.2)) or None

    [letter] = wait_for(letters, 20, "the dead letter")
    assert letter.event is not None and letter.event.event_id == abandonment.event_id
    info = dead_letter_info(letter.headers)
    assert info["stage"] == "recovery" and "3 recovery attempts" in info["error"]


def test_daemon_killed_mid_compensation_neither_loses_nor_repeats_it(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=2)
    _fill_history(settings, 3000)
    state = tmp_path / "state"
    first = stack.start_daemon(settings, state, tools="tests.e2e.recovery_slow_tools:registry")
    workflow = "wf-" + uuid.uuid4().hex[:8]
    agent = stack.run_agent(settings, BOOKINGS, workflow, "s", BOOKING, kill="after_effect")
    assert agent.returncode == -9
    watcher = LogWatcher(settings)
    try:
        step = wait_for(lambda: watcher.step(workflow), 10, "the intent")
        key = step.idempotency_key

        def cancelled_mid_resolution() -> bool:
            stalled = watcher.step(workflow)
            compensating = stalled is not None and stalled.status is StepStatus.COMPENSATING
            return compensating and count(stack, "bookings", "cancel", key) == 1

        wait_for(cancelled_mid_resolution, 15, "the compensation to run and stall")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        stack.daemons.remove(first)
        stack.start_daemon(settings, state)

        def compensated() -> bool:
            done = watcher.step(workflow)
            return done is not None and done.status is StepStatus.COMPENSATED

        wait_for(compensated, 15, "the restarted daemon to finish the compensation")
        events = watcher.of(workflow)
    finally:
        watcher.close()
    assert count(stack, "bookings", "cancel", key) == 1
    assert count(stack, "bookings", "booking", key) == 1
    kinds = [e.type for e in events]
    assert kinds.count("compensation_intended") == 1 and kinds.count("compensation_outcome") == 1
    assert len({e.event_id for e in events}) == len(events)
    # The restart read only what came after its checkpoint, not the 3000 older events.
    assert int(health(state)["events_read"]) < 1000  # type: ignore[call-overload]


def test_two_daemons_split_partitions_and_decide_each_intent_once(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=4)
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first = stack.start_daemon(settings, first_dir)
    second = stack.start_daemon(settings, second_dir)

    def split() -> bool:
        a, b = health(first_dir), health(second_dir)
        pa, pb = set(a["partitions"]), set(b["partitions"])  # type: ignore[call-overload]
        return bool(pa and pb) and not (pa & pb) and pa | pb == {0, 1, 2, 3}

    wait_for(split, 30, "the two daemons to split the partitions")
    keys = _open_intents(settings, stack, "one", 12)
    watcher = LogWatcher(settings)
    try:
        _wait_all_decided(watcher, keys)
        stop(second)  # a graceful leave: the first takes over every partition
        stack.daemons.remove(second)
        more = _open_intents(settings, stack, "two", 12)
        _wait_all_decided(watcher, more)
        decisions = [e for e in watcher.refresh().events if isinstance(e.body, ev.StepOutcome)]
    finally:
        watcher.close()
    assert first.poll() is None
    by_step: dict[str, set[str]] = {}
    for event in decisions:
        by_step.setdefault(event.workflow_id, set()).add(event.event_id)
    assert set(by_step) == set(keys) | set(more)
    assert all(len(ids) == 1 for ids in by_step.values()), by_step
    for key in [*keys.values(), *more.values()]:
        assert count(stack, "payments", "charge", key) == 1


def _open_intents(settings: Settings, stack: Stack, batch: str, n: int) -> dict[str, str]:
    """Append intents as crashed agents leave them (no call, no outcome): workflow -> key."""
    tool = payments_tool(stack.services["payments"].url, timeout_s=1.0)
    factory = EventFactory(settings.fleet_id, "agent")
    log = KafkaEventLog(settings)
    keys: dict[str, str] = {}
    try:
        for i in range(n):
            workflow = f"wf-{batch}-{i}-{uuid.uuid4().hex[:6]}"
            intent = factory.intent(workflow, "s", tool, {**CHARGE, "amount": 100 + i}, sequence=0)
            log.append(intent)
            assert isinstance(intent.body, ev.StepIntended)
            keys[workflow] = intent.body.idempotency_key
    finally:
        log.close()
    return keys


def _wait_all_decided(watcher: LogWatcher, keys: dict[str, str]) -> None:
    def decided() -> bool:
        watcher.refresh()
        steps = [watcher.states.get(w) for w in keys]
        return all(s is not None and s.steps["s"].status is StepStatus.SUCCEEDED for s in steps)

    wait_for(decided, 30, f"{len(keys)} intents to be resolved")
    for workflow in keys:
        step = watcher.states[workflow].steps["s"]
        assert step.resolved_by is Source.RECOVERY_REDRIVE


def _fill_history(settings: Settings, n: int) -> None:
    """Settled history the daemon must not replay after a restart."""
    factory = EventFactory(settings.fleet_id, "history")
    producer = DurableProducer(settings)
    codec = codec_for(settings)
    try:
        futures = []
        for i in range(n):
            event = factory.workflow_started(
                f"old-{i}", name="", attempt=1, read_only=False, max_attempts=3
            )
            futures.append(
                producer.send(settings.topic, event.workflow_id.encode(), codec.encode(event))
            )
        assert producer.flush(30) == 0
        for future in futures:
            producer.wait(future, timeout=30)
    finally:
        producer.close()

"""Sizes are checked against the limit that applies: the step log's own max.message.bytes.

A step log created with a small ``max.message.bytes`` (Apache Kafka enforces it; the
producer's ``message.max.bytes`` stays at 1 MB): a result that fits the producer's limit
but not the topic's must neither fail the agent after the effect nor make the recovery
daemon re-drive the tool forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain import oversize
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import BrokerError, RecordTooLargeError, ResultTypeError
from stepledger.kafka import DurableProducer, ensure_topics, topics
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import step_log_config
from stepledger.producer import Ledger
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry

pytestmark = pytest.mark.kafka_only
TOPIC_LIMIT = 20_000
BLOB = {"blob": "x" * 50_000}  # fits the producer's 1 MB, not the topic's 20 kB
MAX_ATTEMPTS = 3


@pytest.fixture
def small(make_settings: Callable[..., Settings]) -> Settings:
    """A step log that takes records of at most TOPIC_LIMIT bytes."""
    settings = make_settings(create=False)
    config = {**step_log_config(), "max.message.bytes": str(TOPIC_LIMIT)}
    ensure_topics(settings, [settings.topic, settings.dlq_topic], configs={settings.topic: config})
    return settings


@pytest.fixture
def describe_refused(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """DescribeConfigs refused, as for a principal without DESCRIBE_CONFIGS on the topic."""

    def refused(settings: Settings, topic: str, names: tuple[str, ...]) -> dict[str, str | None]:
        raise BrokerError("Broker: Topic authorization failed")

    monkeypatch.setattr(topics, "_describe", refused)
    yield


def events_of(settings: Settings, workflow_id: str) -> list[ev.Event]:
    records = read_topic(settings, Codec(), idle_timeout=0.3)
    return [r.event for r in records if r.event is not None and r.event.workflow_id == workflow_id]


def fetch_tool(calls: list[str]) -> Tool:
    def run(args: dict[str, Any], key: str) -> dict[str, str]:
        calls.append(key)
        return BLOB

    return Tool(
        name="fetch",
        keyed=True,
        policy="redrive",
        run=run,
        redrive=run,
        timeout_s=0.5,
        max_attempts=MAX_ATTEMPTS,
    )


def test_the_broker_refuses_a_record_over_the_topics_limit_as_too_large(small: Settings) -> None:
    producer = DurableProducer(small)
    try:
        with pytest.raises(RecordTooLargeError):
            producer.append(small.topic, b"k", b"v" * 30_000)
        # The idempotent producer goes on: the next record is acknowledged.
        assert producer.append(small.topic, b"k", b"small").offset >= 0
    finally:
        producer.close()


def test_the_agent_records_a_digest_within_the_topics_limit_instead_of_failing_after_the_effect(
    small: Settings,
) -> None:
    calls: list[str] = []
    tool = fetch_tool(calls)
    with Ledger(small) as ledger:
        assert ledger.record_limit == oversize.record_limit(TOPIC_LIMIT)
        wf = ledger.workflow("wf-big")
        with pytest.raises(ResultTypeError, match="larger than a record may hold"):
            wf.step("fetch", tool, {"q": 1})
    step = replay("wf-big", events_of(small, "wf-big")).steps["fetch"]
    assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    with Ledger(small) as ledger, pytest.raises(ResultTypeError):
        ledger.workflow("wf-big").step("fetch", tool, {"q": 1})
    assert len(calls) == 1, "the effect happened once and is never made again"


def test_without_describe_configs_the_agent_falls_back_and_still_records_a_digest(
    small: Settings, describe_refused: None, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    tool = fetch_tool(calls)
    with caplog.at_level(logging.WARNING, logger="stepledger.kafka.topics"):
        for workflow_id in ("wf-a", "wf-b"):
            with Ledger(small) as ledger:
                assert ledger.record_limit == oversize.record_limit(1_000_000)
                with pytest.raises(ResultTypeError):
                    ledger.workflow(workflow_id).step("fetch", tool, {"q": workflow_id})
    lines = [r.getMessage() for r in caplog.records if "max.message.bytes" in r.getMessage()]
    assert len(lines) == 1 and "DESCRIBE_CONFIGS" in lines[0], "one line, once per process"
    for workflow_id in ("wf-a", "wf-b"):
        step = replay(workflow_id, events_of(small, workflow_id)).steps["fetch"]
        assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    assert len(calls) == 2


def run_daemon(
    settings: Settings, tools: ToolRegistry, state: Path, until: Callable[[], bool]
) -> float:
    """Run a recovery daemon until ``until()`` holds (bounded); return how long it took."""
    options = DaemonOptions(
        state_dir=state, grace_s=0.0, retry_base_s=0.05, consumer={"fetch.wait.max.ms": 10}
    )
    daemon = RecoveryDaemon(settings, tools, options, dead_letters=MemoryEventLetters())
    thread = threading.Thread(target=daemon.run, kwargs={"max_seconds": 120.0}, daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        deadline = began + 60
        while time.monotonic() < deadline and not until():
            time.sleep(0.2)
    finally:
        daemon.shutdown.request()
        thread.join(timeout=60)
    assert not thread.is_alive()
    return time.monotonic() - began


def _intent_only(settings: Settings, tool: Tool, workflow_id: str) -> None:
    """A workflow whose agent died after the intent (its deadline passes at once)."""
    with Ledger(settings) as ledger:
        wf = ledger.workflow(workflow_id)
        wf.record(ledger.events.intent(workflow_id, "fetch", tool, {"q": 1}, sequence=0))


def test_a_redrive_whose_outcome_cannot_be_recorded_stops_after_its_attempts_and_escalates(
    small: Settings, describe_refused: None, tmp_path: Path
) -> None:
    calls: list[str] = []
    tool = fetch_tool(calls)
    _intent_only(small, tool, "wf-redrive")

    def escalated() -> bool:
        return any(e.type == "step_abandoned" for e in events_of(small, "wf-redrive"))

    run_daemon(small, ToolRegistry([tool]), tmp_path / "recovery", escalated)
    events = events_of(small, "wf-redrive")
    step = replay("wf-redrive", events).steps["fetch"]
    assert step.status is StepStatus.ABANDONED and step.escalation_open, "escalated"
    assert len(calls) == MAX_ATTEMPTS, "bounded: one re-drive per counted attempt"
    tried = [e.body for e in events if isinstance(e.body, ev.ResolutionAttempted)]
    assert [b.attempt for b in tried if b.error and "could not be recorded" in b.error] == [
        1,
        2,
        3,
    ]
    abandoned = [e.body for e in events if isinstance(e.body, ev.StepAbandoned)]
    assert "recovery attempts failed" in abandoned[0].reason


def test_a_redrive_knowing_the_topics_limit_records_its_outcome_as_a_digest(
    small: Settings, tmp_path: Path
) -> None:
    calls: list[str] = []
    tool = fetch_tool(calls)
    _intent_only(small, tool, "wf-fits")

    def decided() -> bool:
        steps = replay("wf-fits", events_of(small, "wf-fits")).steps
        return steps["fetch"].status is not StepStatus.INTENDED

    run_daemon(small, ToolRegistry([tool]), tmp_path / "recovery", decided)
    step = replay("wf-fits", events_of(small, "wf-fits")).steps["fetch"]
    assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    assert len(calls) == 1

"""Records fit the limit that applies; a decision that cannot be recorded is counted, not looped.

``SmallTopic`` is an in-memory step log that refuses records over a size, as a topic's own
``max.message.bytes`` below the producer's does on Apache Kafka (the broker's refusal is a
``RecordTooLargeError``); the writer does not know that limit, as when ``DescribeConfigs``
is refused.  The same cases on Apache Kafka: ``tests/integration/test_topic_record_limit.py``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.deadletters import letter
from stepledger.domain import events as ev
from stepledger.domain import oversize
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, WorkflowState, replay
from stepledger.domain.tools import Found, Tool
from stepledger.errors import RecordTooLargeError, ResultTypeError
from stepledger.kafka import Position, topics
from stepledger.log import InMemoryEventLog
from stepledger.resolution import MemoryEventLetters, Resolver, ToolRegistry
from tests.unit.factories import Clock
from tests.unit.resume_fakes import World

LIMIT = 20_000
BLOB = {"blob": "x" * 50_000}


class SmallTopic(InMemoryEventLog):
    """Refuses an event whose JSON is over LIMIT bytes, and counts the refusals."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def append(self, event: ev.Event) -> Position:
        if len(event.model_dump_json()) > LIMIT:
            self.refused += 1
            raise RecordTooLargeError("record not acknowledged: Broker: Message size too large")
        return super().append(event)


def big(calls: list[str], **kw: Any) -> Tool:
    def run(args: dict[str, Any], key: str) -> dict[str, str]:
        calls.append(key)
        return BLOB

    return Tool(name="fetch", keyed=True, policy="redrive", run=run, redrive=run, **kw)


def test_the_record_limit_keeps_the_envelopes_room_and_half_of_a_small_limit() -> None:
    assert oversize.record_limit(1_000_000) == 1_000_000 - oversize.ENVELOPE_ROOM
    assert oversize.record_limit(20_000) == 10_000
    assert oversize.fitted_value({"a": 1}, 100) == {"a": 1}
    cut = oversize.fitted_value(BLOB, 1000)
    assert cut["truncated"] and cut["bytes"] > 50_000 and len(cut["head"]) == oversize.HEAD_CHARS


def test_the_limit_that_applies_is_the_smaller_of_the_producers_and_the_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = {"small": 20_000, "large": 5_000_000, "silent": None}
    monkeypatch.setattr(letter, "topic_max_message_bytes", lambda s, topic: found[topic])
    settings = Settings()
    assert letter.max_message_bytes(settings) == letter.DEFAULT_MAX_BYTES
    assert letter.max_message_bytes(settings, "small") == 20_000
    assert letter.max_message_bytes(settings, "large") == letter.DEFAULT_MAX_BYTES
    assert letter.max_message_bytes(settings, "silent") == letter.DEFAULT_MAX_BYTES


def test_a_refused_describe_is_one_line_and_read_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[str] = []

    def refused(settings: Settings, topic: str, names: tuple[str, ...]) -> dict[str, str | None]:
        asked.append(topic)
        raise RuntimeError("TOPIC_AUTHORIZATION_FAILED")

    monkeypatch.setattr(topics, "_describe", refused)
    monkeypatch.setattr(topics, "_max_bytes", {})
    settings = Settings(bootstrap="127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="stepledger.kafka.topics"):
        assert topics.topic_max_message_bytes(settings, "log") is None
        assert topics.topic_max_message_bytes(settings, "log") is None
    assert asked == ["log"]
    [line] = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "DESCRIBE_CONFIGS" in line


def test_an_outcome_the_topic_refuses_is_recorded_as_its_digest_not_left_in_doubt() -> None:
    world, calls = World(), list[str]()
    world.log = SmallTopic()
    tool = big(calls)
    with pytest.raises(ResultTypeError, match="larger than a record may hold"):
        world.ledger().workflow("wf").step("fetch", tool, {"q": 1})
    step = replay("wf", world.log.workflow_events("wf")).steps["fetch"]
    assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    assert world.log.refused == 1 and len(calls) == 1
    with pytest.raises(ResultTypeError):
        world.ledger().workflow("wf").step("fetch", tool, {"q": 1})
    assert len(calls) == 1, "replayed: never called again"


def test_an_async_outcome_the_topic_refuses_is_recorded_as_its_digest() -> None:
    world, calls = World(), list[str]()
    world.log = SmallTopic()
    wf = world.ledger().workflow("wf")
    with pytest.raises(ResultTypeError):
        asyncio.run(wf.astep("fetch", big(calls), {"q": 1}))
    assert wf.state.steps["fetch"].result_type == oversize.TOO_LARGE and len(calls) == 1


class Decisions:
    """A resolver over a SmallTopic, with a workflow whose agent died after the intent."""

    def __init__(self, tool: Tool, record_limit: int | None) -> None:
        self.clock = Clock()
        self.log = SmallTopic()
        self.tool = tool
        self.resolver = Resolver(
            self.log,
            EventFactory("fleet", "recovery", self.clock),
            ToolRegistry([tool]),
            dead_letters=MemoryEventLetters(),
            clock=self.clock,
            retry_base_s=0.01,
            record_limit=record_limit,
        )
        self.log.append(
            EventFactory("fleet", "agent", self.clock).intent("wf", "s", tool, {}, sequence=0)
        )

    def attempt(self) -> WorkflowState:
        self.clock.now += timedelta(seconds=self.tool.timeout_s + 1)
        state = replay("wf", self.log.workflow_events("wf"))
        self.resolver.attempt(state, "s")
        return replay("wf", self.log.workflow_events("wf"))


def test_a_redrive_whose_outcome_the_topic_refuses_is_counted_and_escalated() -> None:
    calls: list[str] = []
    decisions = Decisions(big(calls, max_attempts=3), record_limit=None)
    states = [decisions.attempt() for _ in range(5)]
    assert [s.steps["s"].recovery_attempts for s in states[:3]] == [1, 2, 3]
    final = states[-1].steps["s"]
    assert final.status is StepStatus.ABANDONED and final.escalation_open
    assert len(calls) == 3, "one re-drive per counted attempt, then a person"
    tried = [e.body for e in decisions.log.events if isinstance(e.body, ev.ResolutionAttempted)]
    failed = [b for b in tried if b.error]
    assert [b.attempt for b in failed] == [1, 2, 3]
    assert all("could not be recorded" in (b.error or "") for b in failed)


def test_a_redrive_records_its_evidence_within_the_limit_too() -> None:
    calls: list[str] = []
    decisions = Decisions(big(calls), record_limit=oversize.record_limit(LIMIT))
    step = decisions.attempt().steps["s"]
    assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    assert decisions.log.refused == 0 and len(calls) == 1
    bodies = [e.body for e in decisions.log.events]
    tried = [b for b in bodies if isinstance(b, ev.ResolutionAttempted)]
    outcome = [b for b in bodies if isinstance(b, ev.StepOutcome)]
    assert '"truncated":true' in (tried[0].answer_json or "")
    assert '"truncated":true' in (outcome[0].evidence_json or "")


def test_an_escalation_whose_probe_answered_a_large_result_is_still_recorded() -> None:
    def run(args: dict[str, Any], key: str) -> str:
        return "sent"

    def query(args: dict[str, Any], key: str) -> Found:
        return Found(BLOB)

    mail = Tool(name="mail", policy="escalate", run=run, query=query, timeout_s=1)
    decisions = Decisions(mail, record_limit=None)  # the topic's limit is not known
    step = decisions.attempt().steps["s"]
    assert step.status is StepStatus.ABANDONED and step.escalation_open
    [abandoned] = [e.body for e in decisions.log.events if isinstance(e.body, ev.StepAbandoned)]
    assert '"truncated":true' in (abandoned.evidence_json or "")
    assert len(abandoned.evidence_json or "") < oversize.EVIDENCE_KEPT + 1000

"""A resume that settles a step says what it waits for, and traces the decision it makes.

Measured on a fresh clone: a resume whose tool has no query hook waited 31.5 s without a
line; a resume that settled a step by a found effect left no ``stepledger.decision`` span
(the recovery daemon's decisions had one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stepledger import tracing
from stepledger.config import Settings
from stepledger.domain.tools import Found, Tool
from stepledger.log import InMemoryEventLog
from stepledger.producer.ledger import Ledger
from stepledger.producer.session import ResumeOptions
from stepledger.testing import Crash, ManualClock

SETTLING = "stepledger.producer.settling"


class Host:
    """A wall clock and a monotonic timer that move together when the agent sleeps."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.now = 1.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.clock.advance(seconds)


def _ledger(log: InMemoryEventLog, host: Host, tool: Tool) -> Ledger:
    return Ledger(
        Settings(fleet_id="fleet", producer_id="test"),
        log=log,
        clock=host.clock,
        timer=host,
        tools=[tool],
        options=ResumeOptions(grace_s=0.5, resolve_timeout_s=120.0),
    )


def _crashed(log: InMemoryEventLog, host: Host, tool: Tool) -> None:
    def dies(_args: dict[str, Any], _key: str) -> Any:
        raise Crash()

    with pytest.raises(Crash):
        _ledger(log, host, tool).workflow("wf-1").step("charge", tool, {"amount": 1}, fn=dies)


def test_a_resume_without_a_query_hook_says_once_what_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    charge = Tool(
        name="charge",
        effect="idempotent",
        keyed=True,
        policy="redrive",
        timeout_s=30,
        run=lambda _args, _key: {"ok": True},  # the re-drive: the same key, called again
    )
    log, host = InMemoryEventLog(), Host()
    _crashed(log, host, charge)
    caplog.set_level(logging.WARNING, logger=SETTLING)
    resumed = _ledger(log, host, charge).workflow("wf-1")
    result = resumed.step("charge", charge, {"amount": 1}, fn=lambda _a, _k: {"ok": True})
    assert result == {"ok": True} and host.now > 30  # it did wait out the deadline
    said = [r for r in caplog.records if r.name == SETTLING]
    assert len(said) == 1, [r.getMessage() for r in said]
    line = said[0].getMessage()
    assert "wf-1 step charge (charge) is in doubt" in line
    assert "waiting 30." in line and "redrive policy" in line and "no query hook" in line


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    yield memory
    provider.shutdown()


def test_a_resume_settling_a_step_by_query_is_a_decision_span(
    exporter: InMemorySpanExporter,
) -> None:
    pay = Tool(
        name="charge",
        effect="idempotent",
        keyed=True,
        policy="query",
        timeout_s=30,
        query=lambda _args, key: Found({"paid": key}),
    )
    log, host = InMemoryEventLog(), Host()
    _crashed(log, host, pay)
    resumed = _ledger(log, host, pay).workflow("wf-1")
    assert resumed.step("charge", pay, {"amount": 1}, fn=lambda _a, _k: {"again": True})
    assert host.now < 30  # found: settled at once, not at the deadline
    decisions = [s for s in exporter.get_finished_spans() if s.name == "stepledger.decision query"]
    assert len(decisions) == 1
    span = decisions[0]
    assert span.attributes is not None and span.attributes["stepledger.step_id"] == "charge"
    assert span.context.trace_id == tracing.workflow_trace_id("wf-1")

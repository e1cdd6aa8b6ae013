"""Spans per step with the SDK's in-memory exporter: attributes, events, replays, headers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import ProxyTracerProvider, get_current_span, use_span

from stepledger import tracing
from stepledger.domain.tools import Tool
from stepledger.log import event_headers
from stepledger.testing import InMemoryEventLog, ledger_over
from tests.unit.factories import factory

PAY = Tool(name="pay", effect="idempotent", keyed=True)


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    # The process-wide provider stays untouched: only stepledger's tracer is this one.
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    yield memory
    provider.shutdown()


def test_a_step_is_a_span_with_a_call_and_a_replay_calls_nothing(
    exporter: InMemorySpanExporter,
) -> None:
    log = InMemoryEventLog()
    calls: list[str] = []
    wf = ledger_over(log).workflow("wf-1")

    def pay(args: dict[str, object], key: str) -> dict[str, bool]:
        calls.append(key)
        return {"ok": True}

    wf.step("charge", PAY, {"amount": 3}, pay)
    ledger_over(log).workflow("wf-1").step("charge", PAY, {"amount": 3})
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("stepledger.call pay") == 1 and names.count("stepledger.step pay") == 2
    assert {s.context.trace_id for s in spans} == {tracing.workflow_trace_id("wf-1")}
    first, again = (s for s in spans if s.name == "stepledger.step pay")
    call = next(s for s in spans if s.name == "stepledger.call pay")
    assert call.parent is not None and call.parent.span_id == first.context.span_id
    assert [e.name for e in first.events] == ["intent acknowledged", "outcome recorded"]
    assert first.attributes is not None and again.attributes is not None
    assert first.attributes["stepledger.idempotency_key"] == calls[0]
    assert first.attributes["stepledger.attempt"] == 1
    assert first.attributes["stepledger.policy"] == PAY.resolution.value
    assert "stepledger.replayed" not in first.attributes
    assert again.attributes["stepledger.replayed"] is True and not again.events
    assert again.attributes["stepledger.idempotency_key"] == calls[0] and len(calls) == 1


def test_an_async_step_is_traced_and_events_carry_the_current_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    async def run() -> None:
        wf = ledger_over(InMemoryEventLog()).workflow("wf-2")

        async def pay(args: dict[str, object], key: str) -> dict[str, bool]:
            return {"ok": True}

        await wf.astep("charge", PAY, {"amount": 1}, pay)

    asyncio.run(run())
    names = [s.name for s in exporter.get_finished_spans()]
    assert "stepledger.call pay" in names and "stepledger.step pay" in names
    event = factory().workflow_started("wf-3", name="", attempt=1, read_only=False, max_attempts=1)
    assert all(k != "traceparent" for k, _ in event_headers(event))
    with tracing._tracer().start_as_current_span("outer") as span:
        headers = dict(event_headers(event))
    traceparent = headers["traceparent"]
    assert traceparent is not None
    assert traceparent.decode().split("-")[1] == f"{span.get_span_context().trace_id:032x}"


def test_without_an_sdk_provider_nothing_is_traced_and_no_header_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracing, "_provider", ProxyTracerProvider)
    assert not tracing._active()
    with use_span(get_current_span(tracing.workflow_context("wf-4"))):
        event = factory().workflow_started(
            "wf-4", name="", attempt=1, read_only=False, max_attempts=1
        )
        assert all(k != "traceparent" for k, _ in event_headers(event))
    calls: list[str] = []
    ledger_over(InMemoryEventLog()).workflow("wf-4").step(
        "s", PAY, {}, lambda a, k: calls.append(k)
    )
    assert len(calls) == 1


def test_a_provider_set_after_the_first_steps_is_seen_at_the_next_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cheap check reads the API's global each time and the environment once a second."""
    from opentelemetry import trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    monkeypatch.setattr(tracing._EnvProvider, "checked_at", -1.0)
    assert not tracing._active()
    provider = TracerProvider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # set_tracer_provider, once
    assert tracing._active()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    assert tracing._none_configured()  # read less than a second ago: not seen yet
    monkeypatch.setattr(tracing._EnvProvider, "checked_at", -1.0)  # a second later
    assert not tracing._none_configured()
    provider.shutdown()


def test_a_pipelined_outcome_is_an_outcome_sent_event_on_its_own_step_span(
    exporter: InMemorySpanExporter,
) -> None:
    from stepledger.producer.session import ResumeOptions

    options = ResumeOptions(pipeline_outcomes=True)
    wf = ledger_over(InMemoryEventLog(), options=options).workflow("wf-p")
    wf.step("charge", PAY, {"amount": 3}, lambda args, key: 1)
    wf.step("refund", PAY, {"amount": 3}, lambda args, key: 2)
    first, second = (s for s in exporter.get_finished_spans() if s.name == "stepledger.step pay")
    # The outcome's acknowledgement came during the next step: its span says only "sent".
    assert [e.name for e in first.events] == ["intent acknowledged", "outcome sent"]
    sent = first.events[1].attributes
    assert sent is not None and sent["stepledger.pipelined"] is True
    assert sent["stepledger.status"] == "succeeded"
    assert [e.name for e in second.events] == ["intent acknowledged", "outcome sent"]


def test_an_asyncio_open_is_one_open_span_with_its_attempt_linked_to_the_caller(
    exporter: InMemorySpanExporter,
) -> None:
    """``aworkflow`` reads on a pool and may record on the loop: still one open span, linked
    to the caller's span (the open ran on a pool thread, where the caller's span was not
    current, so the link was lost)."""
    log = InMemoryEventLog()
    caller = TracerProvider().get_tracer("caller")

    async def run() -> int:
        ledger = ledger_over(log)
        with caller.start_as_current_span("request") as request:
            await ledger.aworkflow("wf-a")
            await ledger.aworkflow("wf-a")  # a resume: attempt 2
            return request.get_span_context().span_id

    request_id = asyncio.run(run())
    opens = [s for s in exporter.get_finished_spans() if s.name == "stepledger.workflow.open"]
    attempts = [s.attributes["stepledger.attempt"] for s in opens if s.attributes is not None]
    assert attempts == [1, 2]
    assert {s.context.trace_id for s in opens} == {tracing.workflow_trace_id("wf-a")}
    assert all([link.context.span_id for link in s.links] == [request_id] for s in opens)

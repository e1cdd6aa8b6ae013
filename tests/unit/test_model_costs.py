"""The token ledger's pure parts and its projection: usage, prices, volatile parts, budgets.

A recorded turn keeps its usage beside the response; a replay's ``model_turn_reused``
counts it as reused, never as spent again; the projection's ``model_calls`` and its views
say the same as the workflow's own reading, in random batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stepledger import tracing
from stepledger.codec import Codec
from stepledger.config import load_prices
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.spend import spend_of
from stepledger.domain.state import replay
from stepledger.domain.tools import Tool
from stepledger.domain.usage import (
    Budget,
    ModelPrice,
    PriceTable,
    TurnUsage,
    Volatile,
    recorded,
    unrecorded,
    usage_of,
)
from stepledger.errors import ConfigError
from stepledger.integrations._core import agent_steps, request_digest
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over
from stepledger.wire import MODEL_STEP_TOOL
from tests.unit.projector_harness import project, to_messages

GPT = TurnUsage(model="gpt", input_tokens=1_000, output_tokens=200, cached_tokens=400)


def test_a_turn_is_priced_by_the_table_cached_input_at_its_own_price() -> None:
    table = PriceTable(models={"gpt": ModelPrice(input=2.0, cached_input=0.5, output=10.0)})
    # 600 uncached at 2.0, 400 cached at 0.5, 200 out at 10.0, per million.
    assert table.cost(GPT) == pytest.approx((600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1e6)
    assert table.cost(GPT.model_copy(update={"model": "other"})) is None
    assert table.priced(GPT.model_copy(update={"model": "other"})).cost is None


def test_a_price_table_loads_from_toml_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    good = tmp_path / "prices.toml"
    good.write_text('[models."gpt"]\ninput = 2.0\noutput = 10.0\n')
    assert load_prices(good).models["gpt"].output == 10.0
    bad = tmp_path / "bad.toml"
    bad.write_text('[models."gpt"]\ninput = -1\noutput = 1\n')
    with pytest.raises(ConfigError, match=r"models\.gpt\.input"):
        load_prices(bad)


def test_usage_rides_beside_the_response_and_an_older_turn_has_none() -> None:
    result = recorded({"output": [1]}, GPT)
    assert unrecorded(result) == ({"output": [1]}, GPT)
    assert unrecorded({"output": [1], "response_id": None}) == (
        {"output": [1], "response_id": None},
        None,
    )
    assert usage_of(None) is None and usage_of("not json") is None


def test_a_declared_volatile_part_leaves_the_digest_and_nothing_else_does() -> None:
    volatile = Volatile(patterns=(r"it is \d\d:\d\d",), keys=frozenset({"request_id"}))
    one = {"prompt": "book (it is 10:01)", "request_id": "a"}
    two = {"prompt": "book (it is 23:59)", "request_id": "b"}
    assert request_digest(volatile.strip(one)) == request_digest(volatile.strip(two))
    other = {"prompt": "cancel (it is 10:01)", "request_id": "a"}
    assert request_digest(volatile.strip(one)) != request_digest(volatile.strip(other))
    assert request_digest(one) != request_digest(two), "undeclared, the time changes it"
    with pytest.raises(ConfigError, match="volatile pattern"):
        Volatile(patterns=("(",))


def test_a_budget_refuses_only_once_spent() -> None:
    budget = Budget(tokens=1_000, cost=1.0)
    assert budget.refusal(999, 0.5) is None
    assert budget.refusal(1_000, 0.5) == "spent 1000 of its 1000 tokens"
    assert budget.refusal(10, 1.0) is not None


def test_the_reuse_mark_round_trips_the_codec() -> None:
    log = InMemoryEventLog()
    wf = ledger_over(log).workflow("wf-c")
    event = wf.ledger.events.envelope("wf-c", "model#1", ev.ModelTurnReused(attempt=2))
    codec = Codec()
    assert codec.decode(codec.encode(event)) == event


def _returning(result: Any) -> Any:
    return lambda _a, _k: result


def _two_runs() -> list[ev.Event]:
    """Two turns recorded, then a resume that reused both and asked a third."""
    log = InMemoryEventLog()
    model = Tool(name=MODEL_STEP_TOOL, read_only=True)
    wf = ledger_over(log, tools=[model]).workflow("wf-1")
    for n, tokens in ((1, 100), (2, 200)):
        turn = recorded(n, TurnUsage(model="m", input_tokens=tokens, output_tokens=10, cost=0.5))
        wf.step(f"model#{n}", model, {"request": f"d{n}"}, fn=_returning(turn))
    for n in (1, 2):
        wf.record(wf.ledger.events.envelope("wf-1", f"model#{n}", ev.ModelTurnReused(attempt=2)))
    usage = TurnUsage(model="m", input_tokens=300, output_tokens=10)
    wf.step("model#3", model, {"request": "d3"}, fn=lambda _a, _k: recorded(3, usage))
    return list(log.workflow_events("wf-1"))


def test_a_workflows_spend_counts_each_turn_once_and_each_reuse_apart() -> None:
    events = _two_runs()
    spend = spend_of(replay("wf-1", events), events)
    assert (spend.turns_incurred, spend.tokens_incurred, spend.cost_incurred) == (3, 630, 1.0)
    assert (spend.turns_reused, spend.tokens_reused, spend.cost_reused) == (2, 320, 1.0)


def test_the_projections_model_calls_agree_in_any_batches(tmp_path: Path) -> None:
    events = _two_runs()
    db = tmp_path / "p.duckdb"
    # Each event twice (a redelivery) and random batch sizes: the ledger is the same.
    project(db, to_messages(events + events), seed=7, largest_batch=3)
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT kind, step_id, attempt, input_tokens FROM model_calls ORDER BY ALL"
        ).fetchall()
        by_workflow = con.execute(
            "SELECT turns_incurred, turns_reused, tokens_incurred, tokens_reused, "
            "cost_incurred, cost_reused FROM model_costs_by_workflow"
        ).fetchall()
        by_day = con.execute("SELECT sum(tokens_incurred) FROM model_costs_by_fleet_day")
        day_total = by_day.fetchone()
    finally:
        con.close()
    assert rows == [
        ("incurred", "model#1", 1, 100),
        ("incurred", "model#2", 1, 200),
        ("incurred", "model#3", 1, 300),
        ("reused", "model#1", 2, 100),
        ("reused", "model#2", 2, 200),
    ]
    assert by_workflow == [(3, 2, 630, 320, 1.0, 1.0)]
    assert day_total == (630,)


def test_a_case_page_says_what_the_workflows_turns_cost_and_what_was_reused() -> None:
    from stepledger.humanqueue.cases import escalation_case
    from tests.integration import inbox_helpers as h

    f = h.factory()
    model = Tool(name=MODEL_STEP_TOOL, read_only=True)
    usage = TurnUsage(model="m", input_tokens=90, output_tokens=10)
    turn = [
        f.intent("trip-1", "model#1", model, {"request": "d"}, sequence=0),
        f.outcome(
            "trip-1",
            "model#1",
            attempt=1,
            status=OutcomeStatus.SUCCEEDED,
            result=recorded({"text": "wire"}, usage),
        ),
        f.envelope("trip-1", "model#1", ev.ModelTurnReused(attempt=2)),
    ]
    wire = list(h.escalated_wire(f, "trip-1", "esc-1"))
    case = escalation_case("trip-1", "esc-1", [*turn, *wire])
    assert case is not None
    assert case.spend == "1 model turns, 100 tokens (reused on resume: 1 turns, 100 tokens)"
    bare = escalation_case("trip-1", "esc-1", wire)
    assert bare is not None and bare.spend == ""


def test_the_projector_counts_tokens_incurred_and_reused_per_fleet_and_model() -> None:
    from stepledger.projector.engine import BatchReport
    from stepledger.projector.metrics import ProjectorMetrics

    metrics = ProjectorMetrics()
    report = BatchReport(tokens={("f1", "m", "incurred"): 630, ("f1", "m", "reused"): 320})
    metrics.record(report, 0.01)
    metrics.record(report, 0.01)
    value = metrics.registry.get_sample_value
    labels = {"fleet": "f1", "model": "m"}
    assert value("stepledger_projector_model_tokens_incurred_total", labels) == 1260
    assert value("stepledger_projector_model_tokens_reused_total", labels) == 640


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    yield memory
    provider.shutdown()


def test_a_turns_span_has_genai_usage_and_a_replayed_one_says_so(
    exporter: InMemorySpanExporter,
) -> None:
    log = InMemoryEventLog()
    usage = TurnUsage(model="m", input_tokens=90, output_tokens=10, cached_tokens=5)
    asked: list[int] = []

    def ask() -> tuple[Any, TurnUsage | None]:
        asked.append(1)
        return {"text": "hi"}, usage

    for _ in range(2):  # a run, then a resume: "another process" over the same log
        steps = agent_steps(ledger_over(log).workflow("wf-t"))
        turn = steps.model_turn_sync([["user", "hello"]], ask)
        assert turn.response == {"text": "hi"} and turn.usage == usage
    assert len(asked) == 1 and turn.reused
    spans = [s for s in exporter.get_finished_spans() if s.name == "stepledger.step model"]
    first, again = (dict(s.attributes or {}) for s in spans)
    assert first["gen_ai.usage.input_tokens"] == 90 and first["gen_ai.response.model"] == "m"
    assert first["gen_ai.usage.cache_read.input_tokens"] == 5
    assert first["stepledger.replayed"] is False
    assert again["gen_ai.usage.output_tokens"] == 10 and again["stepledger.replayed"] is True


def test_the_domains_model_tool_is_the_wires() -> None:
    from stepledger.domain import spend

    assert spend.MODEL_TOOL == MODEL_STEP_TOOL  # the pure domain cannot import wire

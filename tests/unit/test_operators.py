"""Operators steer workflows through events of the log: pause, unpause, cancel (in memory).

The fold holds a paused workflow (it stays running, shown ``paused``); the runner starts no
step while it is held: a pause it knows stops the step before its intent, a pause that lies
before its intent in the log's order stops the call (the intent gets ``not_happened``, so
the step runs again under its key once unpaused), and a step already in flight finishes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import click
import pytest

from stepledger.cli._operators import selected
from stepledger.codec import Codec, load_envelope_schema, schema_dir
from stepledger.domain import events as ev
from stepledger.domain import operators, restart
from stepledger.domain.enums import WorkflowStatus
from stepledger.domain.state import RunStatus, StepStatus, WorkflowState, replay
from stepledger.domain.tools import Tool
from stepledger.errors import (
    LedgerStateError,
    PlanMismatchError,
    UnknownSchemaError,
    ViewStoreError,
    WorkflowCancelledError,
    WorkflowPausedError,
)
from stepledger.humanqueue.operators import carry_restart
from stepledger.log import InMemoryEventLog
from stepledger.producer.session import ResumeOptions
from stepledger.testing import ledger_over
from tests.unit.factories import factory


def charge_tool(calls: list[str]) -> Tool:
    def run(args: dict[str, Any], key: str) -> dict[str, str]:
        calls.append(key)
        return {"charge": key}

    return Tool(name="charge", effect="idempotent", keyed=True, run=run)


def steer(log: InMemoryEventLog, workflow_id: str, decide: Any, by: str = "ops") -> None:
    """What the CLI does: fold the workflow, decide, append the event."""
    state = replay(workflow_id, log.workflow_events(workflow_id))
    decision = decide(state, by, "incident", "declared")
    assert decision.body is not None, decision.note
    log.append(factory().envelope(workflow_id, None, decision.body))


def started() -> list[ev.Event]:
    f = factory()
    return [f.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)]


def folded(*bodies: ev.Body) -> WorkflowState:
    f = factory()
    return replay("wf", started() + [f.envelope("wf", None, b, i) for i, b in enumerate(bodies)])


def test_a_pause_holds_a_running_workflow_until_its_unpause() -> None:
    state = folded(ev.WorkflowPaused(by="ann", reason="provider down", pause=1))
    assert (state.status, state.shown_status, state.paused_by) == (
        RunStatus.RUNNING,
        RunStatus.PAUSED,
        "ann",
    )
    again = folded(ev.WorkflowPaused(by="ann", pause=1), ev.WorkflowPaused(by="bob", pause=1))
    assert again.paused_by == "ann" and not again.anomalies
    lifted = folded(ev.WorkflowPaused(by="ann", pause=1), ev.WorkflowUnpaused(by="bob", pause=1))
    assert not lifted.halted and lifted.shown_status is RunStatus.RUNNING


def test_an_unpause_of_an_older_pause_lifts_nothing() -> None:
    state = folded(
        ev.WorkflowPaused(by="ann", pause=1),
        ev.WorkflowUnpaused(by="ann", pause=1),
        ev.WorkflowPaused(by="ann", pause=2),
        ev.WorkflowUnpaused(by="late", pause=1),
    )
    assert state.paused_by == "ann" and [a.kind for a in state.anomalies] == ["stale_unpause"]


def test_an_ended_workflow_is_neither_paused_nor_cancelled() -> None:
    end = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED)
    state = folded(end, ev.WorkflowPaused(by="a"), ev.WorkflowCancelRequested(by="a"))
    assert not state.halted
    assert [a.kind for a in state.anomalies] == ["pause_after_end", "cancel_after_end"]
    assert operators.pause(state, "a", "", None).body is None


def test_a_cancel_request_halts_and_shows_cancelling() -> None:
    state = folded(ev.WorkflowCancelRequested(by="ann", reason="wrong customer"))
    assert state.halted and state.shown_status is RunStatus.CANCELLING


def test_each_claim_records_the_app_and_stepledger_versions() -> None:
    log = InMemoryEventLog()
    ledger_over(log, app_version="2.1").workflow("wf")
    state = replay("wf", log.workflow_events("wf"))
    app, own = state.versions[1]
    assert app == "2.1" and own
    assert state.version_of(1).startswith("app version 2.1 (stepledger ")


def test_a_known_pause_stops_the_next_step_before_its_intent() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    wf = ledger_over(log).workflow("wf")
    steer(log, "wf", operators.pause)
    wf.adopt(log.workflow_events("wf")[-1:])
    with pytest.raises(WorkflowPausedError, match="paused by ops"):
        wf.step("c1", charge_tool(calls))
    assert calls == [] and "c1" not in replay("wf", log.workflow_events("wf")).steps


def test_a_pause_before_the_intent_in_the_log_stops_the_call_then_it_runs_once() -> None:
    """The runner did not know the pause; the fence's read through its intent finds it."""
    log, calls = InMemoryEventLog(), list[str]()
    wf = ledger_over(log).workflow("wf")
    steer(log, "wf", operators.pause)  # another process: this handle has not read it
    with pytest.raises(WorkflowPausedError):
        wf.step("c1", charge_tool(calls))
    step = replay("wf", log.workflow_events("wf")).steps["c1"]
    assert calls == [] and step.status is StepStatus.NOT_HAPPENED
    steer(log, "wf", operators.unpause)
    again = ledger_over(log).workflow("wf")
    again.step("c1", charge_tool(calls))
    assert calls == [step.idempotency_key]  # once, under the key of the stopped attempt


def test_a_step_in_flight_finishes_and_the_next_one_stops() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    wf = ledger_over(log).workflow("wf")
    wf.after_intent = lambda step_id: steer(log, "wf", operators.pause)
    assert wf.step("c1", charge_tool(calls)) == {"charge": calls[0]}
    wf.after_intent = None
    with pytest.raises(WorkflowPausedError):
        wf.step("c2", charge_tool(calls))
    assert len(calls) == 1


def test_a_runner_that_waits_goes_on_at_the_unpause() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    options = ResumeOptions(grace_s=0.0, on_pause="wait", pause_wait_s=10.0)
    wf = ledger_over(log, options=options).workflow("wf")
    steer(log, "wf", operators.pause)
    timer = threading.Timer(0.2, steer, (log, "wf", operators.unpause))
    timer.start()
    try:
        wf.step("c1", charge_tool(calls))
    finally:
        timer.cancel()
    assert len(calls) == 1
    assert replay("wf", log.workflow_events("wf")).steps["c1"].status is StepStatus.SUCCEEDED


def test_a_restarted_runner_of_a_paused_workflow_stays_paused() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    ledger_over(log).workflow("wf").step("c1", charge_tool(calls))
    steer(log, "wf", operators.pause)
    again = ledger_over(log).workflow("wf")  # a new process: replays, then stops
    assert again.step("c1", charge_tool(calls)) == {"charge": calls[0]}
    with pytest.raises(WorkflowPausedError):
        again.step("c2", charge_tool(calls))
    assert len(calls) == 1


def test_a_cancel_request_is_never_waited_out() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    options = ResumeOptions(on_pause="wait", pause_wait_s=30.0)
    wf = ledger_over(log, options=options).workflow("wf")
    steer(log, "wf", operators.request_cancel)
    wf.reload()
    with pytest.raises(WorkflowCancelledError, match="workflows cancel"):
        wf.step("c1", charge_tool(calls))
    assert calls == []


def test_a_plan_mismatch_names_both_versions() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    ledger_over(log, app_version="1.0").workflow("wf").step("c1", charge_tool(calls))
    newer = ledger_over(log, app_version="2.0").workflow("wf")
    with pytest.raises(PlanMismatchError) as caught:
        newer.step("refund", charge_tool(calls), amount=3)
    assert "app version 1.0" in str(caught.value) and "app version 2.0" in str(caught.value)


def test_operator_events_round_trip_and_a_0_3_reader_refuses_them_by_fingerprint() -> None:
    """Until every reader runs 0.4.0 an event of its schema is skipped by older ones (the
    SDK's history and recovery skip an unknown schema with a warning, the projector
    dead-letters it): the CHANGELOG's upgrade order."""
    f = factory()
    events = [
        f.envelope("wf", None, ev.WorkflowPaused(by="a", reason="r", auth="declared", pause=2)),
        f.envelope("wf", None, ev.WorkflowUnpaused(by="a", pause=2)),
        f.envelope("wf", None, ev.WorkflowCancelRequested(by="a")),
        f.envelope("wf", None, ev.WorkflowPaused(by="a", pause=3, hold_recovery=True), 3),
        f.workflow_resumed("wf", attempt=2, reason="cancel: r", runner="r1", operator="a"),
    ]
    for compiled in (True, False):
        codec = Codec(compiled=compiled)
        assert [codec.decode(codec.encode(e)) for e in events] == events
    old = Codec(load_envelope_schema(schema_dir() / "released" / "0.3.0"))
    with pytest.raises(UnknownSchemaError):
        old.decode(Codec().encode(events[0]))


def trip_tools(calls: list[str]) -> dict[str, Tool]:
    def run(name: str) -> Any:
        def call(args: dict[str, Any], key: str) -> str:
            calls.append(f"{name}:{key}")
            return name

        return call

    def undo(args: dict[str, Any], key: str, result: Any) -> None:
        calls.append(f"undo:{key}")

    return {
        "book": Tool(
            name="book", effect="compensatable", keyed=True, run=run("book"), compensate=undo
        ),
        "email": Tool(name="email", effect="irreversible", run=run("email")),
    }


def test_a_restart_undoes_what_follows_the_step_and_replays_what_precedes_it() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    tools = trip_tools(calls)
    old = ledger_over(log, tools=tools.values()).workflow("trip")
    old.step("hotel", tools["book"], hotel="A")
    old.step("car", tools["book"], hotel="garage")
    plan = restart.plan(old.state, "car", "trip.r1")
    assert [s.step_id for s in plan.replayed] == ["hotel"] and plan.refusal is None
    assert [s.step_id for s in plan.undo] == ["car"]
    calls.clear()
    ledger = ledger_over(log, tools=tools.values())
    line = carry_restart(ledger, plan, "fixed the car tool", by="ops")
    assert line == "trip: restarted as trip.r1 from car"
    assert calls == [f"undo:{plan.undo[0].idempotency_key}"]
    ended = replay("trip", log.workflow_events("trip"))
    assert ended.status is RunStatus.RESTARTED and ended.restarted_as == "trip.r1"
    calls.clear()
    new = ledger_over(log, tools=tools.values()).workflow("trip.r1")
    assert new.state.restarted_from == "trip" and new.state.restart_step == "car"
    assert new.step("hotel", tools["book"], hotel="A") == "book"  # replayed: no call
    new.step("car", tools["book"], hotel="garage")
    new.finish()
    assert len(calls) == 1 and calls[0].startswith("book:")
    assert calls[0] != f"book:{plan.undo[0].idempotency_key}"  # the new workflow's key


def test_a_restart_across_a_standing_irreversible_effect_is_refused_naming_it() -> None:
    log, calls = InMemoryEventLog(), list[str]()
    tools = trip_tools(calls)
    old = ledger_over(log, tools=tools.values()).workflow("trip")
    old.step("hotel", tools["book"], hotel="A")
    old.step("email", tools["email"], to="a@example.test")
    plan = restart.plan(old.state, "hotel", "trip.r1")
    assert plan.refusal is not None and "email (email, happened, cannot be undone)" in plan.refusal
    with pytest.raises(LedgerStateError, match="refused"):
        carry_restart(ledger_over(log, tools=tools.values()), plan, "r", by="ops")
    assert replay("trip", log.workflow_events("trip")).status is RunStatus.RUNNING


def test_where_selects_over_the_projections_workflows_table(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    db = tmp_path / "projection.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE workflows (workflow_id VARCHAR, name VARCHAR, status VARCHAR)")
        con.execute(
            "INSERT INTO workflows VALUES ('t-1', 'trip', 'running'), ('t-2', 'trip', 'paused'),"
            " ('t-3', 'trip', 'running'), ('o-1', 'order', 'running')"
        )
    where = "status = 'running' AND name = 'trip'"
    assert selected(("o-1", "t-3"), where, db) == ["o-1", "t-3", "t-1"]
    with pytest.raises(click.UsageError, match="--db"):
        selected((), where, None)
    with pytest.raises(ViewStoreError):
        selected((), "1=1; DROP TABLE workflows", db)

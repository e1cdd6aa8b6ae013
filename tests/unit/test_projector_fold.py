"""The projection equals the domain fold: statuses, anomalies, duplicates, batch boundaries."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import duckdb
import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import CompensationStatus, OutcomeStatus, Source, Verdict
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import replay
from stepledger.projector.rows import (
    ANOMALY_COLUMNS,
    ESCALATION_COLUMNS,
    EVENT_COLUMNS,
    STEP_COLUMNS,
    WORKFLOW_COLUMNS,
    step_row,
)
from stepledger.projector.schema import ARROW
from tests.unit.factories import T0, comp_key, factory
from tests.unit.projector_harness import project, table_contents, to_messages
from tests.unit.projector_logs import TOOLS, random_log

PAY, BOOK = TOOLS[0], TOOLS[1]


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def by_workflow(events: list[ev.Event]) -> dict[str, list[ev.Event]]:
    grouped: dict[str, list[ev.Event]] = defaultdict(list)
    for event in events:
        grouped[event.workflow_id].append(event)
    return grouped


def test_fold_columns_match_the_table_schema() -> None:
    for table, columns in {
        "events": EVENT_COLUMNS,
        "steps": STEP_COLUMNS,
        "workflows": WORKFLOW_COLUMNS,
        "escalations": ESCALATION_COLUMNS,
        "anomalies": ANOMALY_COLUMNS,
    }.items():
        assert tuple(ARROW[table].names) == columns, table


def test_intents_outcomes_compensations_and_abandonments_project_to_their_statuses(
    tmp_path: Path,
) -> None:
    f = factory()
    esc = "esc-1"
    log = [
        f.workflow_started("wf", name="trip", attempt=1, read_only=False, max_attempts=3),
        f.intent("wf", "charge", PAY, {"a": 1}, sequence=0),
        f.outcome("wf", "charge", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"id": 7}),
        f.intent("wf", "hotel", BOOK, {"n": 2}, sequence=1),
        f.outcome("wf", "hotel", attempt=1, status=OutcomeStatus.SUCCEEDED),
        f.envelope(
            "wf",
            "hotel",
            ev.CompensationIntended(
                idempotency_key=comp_key("wf", "hotel", BOOK),
                reason="undo",
                source=Source.AGENT,
                deadline=T0,
            ),
        ),
        f.envelope(
            "wf",
            "hotel",
            ev.CompensationOutcome(status=CompensationStatus.SUCCEEDED, source=Source.AGENT),
        ),
        f.intent("wf", "flight", BOOK, {"n": 3}, sequence=2),
        f.envelope(
            "wf",
            "flight",
            ev.CompensationIntended(
                idempotency_key=comp_key("wf", "flight", BOOK),
                reason="undo",
                source=Source.RECOVERY_COMPENSATE,
                deadline=T0,
            ),
        ),
        f.intent("wf", "mail", PAY, {}, sequence=3),
        f.envelope(
            "wf",
            "mail",
            ev.StepAbandoned(reason="stuck", escalation_id=esc, source=Source.RECOVERY),
        ),
        f.intent("wf", "open", PAY, {}, sequence=4),
        f.intent("wf", "retry", PAY, {}, sequence=5),
        f.outcome("wf", "retry", attempt=1, status=OutcomeStatus.FAILED, error="declined"),
        f.intent("wf", "retry", PAY, {}, sequence=5, attempt=2),
        f.outcome("wf", "retry", attempt=2, status=OutcomeStatus.SUCCEEDED),
    ]
    db = tmp_path / "p.duckdb"
    project(db, to_messages(log))
    got = {
        step: status
        for step, status in rows(
            db, "SELECT step_id, status || CASE WHEN in_doubt THEN '?' ELSE '' END FROM steps"
        )
    }
    assert got == {
        "charge": "succeeded",
        "hotel": "compensated",
        "flight": "compensating",
        "mail": "abandoned",
        "open": "intended?",
        "retry": "succeeded",
    }
    assert rows(db, "SELECT attempt, duration_ms >= 0 FROM steps WHERE step_id = 'retry'") == [
        (2, True)
    ]
    assert rows(db, "SELECT escalation_id, status, kind FROM escalations") == [
        (esc, "open", "step")
    ]
    assert rows(db, "SELECT step_id FROM open_intents ORDER BY 1") == [("open",)]
    assert rows(db, "SELECT steps, in_doubt, succeeded, compensated, abandoned FROM workflows") == [
        (6, 1, 2, 1, 1)
    ]


def test_anomalies_are_recorded_not_applied_and_escalations_resolve(tmp_path: Path) -> None:
    f = factory()
    log = [
        f.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=3),
        f.outcome("wf", "ghost", attempt=1, status=OutcomeStatus.SUCCEEDED),
        f.intent("wf", "s", PAY, {}, sequence=0),
        f.outcome(
            "wf", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY
        ),
        f.outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED),
        f.intent("wf", "x", PAY, {}, sequence=1),
        f.envelope(
            "wf", "x", ev.StepAbandoned(reason="?", escalation_id="e1", source=Source.RECOVERY)
        ),
        f.envelope(
            "wf", "x", ev.EscalationResolved(escalation_id="e1", verdict=Verdict.HAPPENED, by="ann")
        ),
        f.envelope(
            "wf",
            None,
            ev.AnomalyObserved(kind="charged_twice", detail="d", source=Source.RECONCILE),
        ),
    ]
    db = tmp_path / "p.duckdb"
    project(db, to_messages(log))
    kinds = rows(db, "SELECT kind, detected_by FROM anomalies ORDER BY log_offset")
    assert kinds == [
        ("no_intent", "projector"),
        ("late_outcome", "projector"),
        ("charged_twice", "reconcile"),
    ]
    assert rows(db, "SELECT status, resolved_by FROM steps WHERE step_id = 's'") == [
        ("not_happened", "recovery_query")
    ]
    assert rows(db, "SELECT status, resolved_by FROM steps WHERE step_id = 'x'") == [
        ("succeeded", "human")
    ]
    assert rows(db, "SELECT status, verdict, resolved_by FROM escalations") == [
        ("resolved", "happened", "ann")
    ]
    assert rows(db, "SELECT count(*) FROM unresolved_escalations") == [(0,)]


def test_read_only_restart_drops_earlier_steps(tmp_path: Path) -> None:
    f = factory()
    log = [
        f.workflow_started("wf", name="", attempt=1, read_only=True, max_attempts=3),
        f.intent("wf", "a", TOOLS[3], {}, sequence=0),
        f.workflow_started("wf", name="", attempt=2, read_only=True, max_attempts=3),
        f.intent("wf", "b", TOOLS[3], {}, sequence=0),
    ]
    for largest in (1, 10):
        db = tmp_path / f"p{largest}.duckdb"
        project(db, to_messages(log), largest_batch=largest)
        assert rows(db, "SELECT step_id FROM steps") == [("b",)]


def test_duplicates_and_redelivered_batches_change_nothing(tmp_path: Path) -> None:
    log = random_log(seed=3, workflows=30)
    messages = to_messages(log)
    once = tmp_path / "once.duckdb"
    project(once, messages)
    twice = tmp_path / "twice.duckdb"
    project(twice, messages)
    # Redelivered: the same records again (skipped by stored offsets) ...
    project(twice, messages, seed=9)
    assert table_contents(twice) == table_contents(once)
    # ... and the same events again at new offsets, as a retried produce would append them.
    replayed = tmp_path / "replayed.duckdb"
    project(replayed, to_messages(log + log))
    want, got = table_contents(once), table_contents(replayed)
    for table in ("steps", "workflows", "escalations", "anomalies"):
        assert got[table] == want[table], table
    assert len(got["events"]) == len(want["events"])


@pytest.mark.parametrize("seed", [1, 2, 5, 8])
def test_projected_steps_equal_the_domain_replay(tmp_path: Path, seed: int) -> None:
    """Random logs (duplicates, anomalies, compensations, escalations, approvals, retries),
    random batch sizes and a tiny cache (evictions replay stored events) vs ``replay()``."""
    log = random_log(seed=seed, workflows=40)
    db = tmp_path / "p.duckdb"
    project(db, to_messages(log), seed=seed, largest_batch=37, cache=3)
    expected_steps, expected_status, expected_anomalies = [], [], []
    for workflow_id, events in by_workflow(log).items():
        state = replay(workflow_id, events)
        expected_steps += [step_row(state, s) for s in state.steps.values()]
        expected_status.append(
            (workflow_id, state.status.value, len(state.steps), len(state.anomalies))
        )
        expected_anomalies += [(a.event_id, a.kind) for a in state.anomalies]
    assert rows(db, "SELECT * FROM steps ORDER BY ALL") == sorted(expected_steps)
    assert rows(
        db, "SELECT workflow_id, status, steps, anomalies FROM workflows ORDER BY ALL"
    ) == sorted(expected_status)
    assert rows(db, "SELECT event_id, kind FROM anomalies ORDER BY ALL") == sorted(
        expected_anomalies
    )
    statuses = {r[0] for r in rows(db, "SELECT DISTINCT status FROM steps")}
    assert {"succeeded", "failed", "intended", "compensated", "abandoned"} <= statuses


def test_batching_and_cache_size_do_not_change_any_table(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=11, workflows=25))
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    project(a, messages, largest_batch=1000, cache=1000)
    project(b, messages, seed=4, largest_batch=7, cache=2)
    assert table_contents(a) == table_contents(b)


def test_each_step_shows_the_app_version_that_ran_it_and_a_paused_workflow_shows_paused(
    tmp_path: Path,
) -> None:
    old = EventFactory("fleet", "p", factory().clock, app_version="1.0", stepledger_version="x")
    new = EventFactory("fleet", "p", factory().clock, app_version="2.0", stepledger_version="x")
    log = [
        old.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=3),
        old.intent("wf", "a", PAY, {"amount": 1}, sequence=0, epoch=1),
        new.workflow_resumed("wf", attempt=2, reason=None),
        new.intent("wf", "b", PAY, {"amount": 2}, sequence=1, epoch=2),
        new.envelope("wf", None, ev.WorkflowPaused(by="ops", pause=1)),
    ]
    db = tmp_path / "p.duckdb"
    project(db, to_messages(log))
    steps = "SELECT step_id, app_version FROM steps ORDER BY step_id"
    assert rows(db, steps) == [("a", "1.0"), ("b", "2.0")]
    assert rows(db, "SELECT status, app_version FROM workflows") == [("paused", "2.0")]

"""The projector daemon against the real broker: statuses, duplicates, poison, multiple topics."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stepledger.codec import SINGLE_OBJECT_MAGIC, Codec
from stepledger.config import Settings
from stepledger.daemon.process import Shutdown
from stepledger.deadletters.letter import dead_letter_info, original_headers
from stepledger.domain import events as ev
from stepledger.domain.enums import CompensationStatus, OutcomeStatus, Source
from stepledger.domain.state import replay
from stepledger.errors import ViewStoreError
from stepledger.kafka.reader import read_topic
from stepledger.projector.daemon import ProjectorOptions, run_projector
from stepledger.projector.rows import step_row
from stepledger.projector.store import ProjectionStore
from tests.integration.projector_helpers import (
    produce_events,
    produce_raw,
    projecting,
    query_one,
)
from tests.unit.factories import T0, comp_key, factory
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import TOOLS, random_log

PAY, BOOK = TOOLS[0], TOOLS[1]


def saga_log() -> list[ev.Event]:
    """One workflow with a step in each interesting status."""
    f = factory()

    def comp(step_id: str, source: Source) -> ev.CompensationIntended:
        key = comp_key("trip", step_id, BOOK)
        return ev.CompensationIntended(
            idempotency_key=key, reason="undo", source=source, deadline=T0
        )

    return [
        f.workflow_started("trip", name="trip", attempt=1, read_only=False, max_attempts=3),
        f.intent("trip", "charge", PAY, {"eur": 10}, sequence=0),
        f.outcome("trip", "charge", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"id": 1}),
        f.intent("trip", "hotel", BOOK, {}, sequence=1),
        f.outcome("trip", "hotel", attempt=1, status=OutcomeStatus.SUCCEEDED),
        f.envelope("trip", "hotel", comp("hotel", Source.AGENT)),
        f.envelope(
            "trip",
            "hotel",
            ev.CompensationOutcome(status=CompensationStatus.SUCCEEDED, source=Source.AGENT),
        ),
        f.intent("trip", "car", BOOK, {}, sequence=2),
        f.envelope("trip", "car", comp("car", Source.RECOVERY_COMPENSATE)),
        f.intent("trip", "mail", PAY, {}, sequence=3),
        f.envelope(
            "trip",
            "mail",
            ev.StepAbandoned(reason="no answer", escalation_id="esc-9", source=Source.RECOVERY),
        ),
        f.intent("trip", "quote", PAY, {}, sequence=4),
        f.intent("trip", "card", PAY, {}, sequence=5),
        f.outcome("trip", "card", attempt=1, status=OutcomeStatus.FAILED, error="declined"),
    ]


def test_a_log_projects_to_the_expected_statuses(settings: Settings, tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    log = saga_log()
    with projecting(settings, db) as daemon:
        daemon.wait_received(produce_events(settings, log))
    statuses = dict(query_one(db, "SELECT step_id, status FROM steps"))
    assert statuses == {
        "charge": "succeeded",
        "hotel": "compensated",
        "car": "compensating",
        "mail": "abandoned",
        "quote": "intended",
        "card": "failed",
    }
    assert query_one(db, "SELECT step_id FROM open_intents") == [("quote",)]
    assert query_one(db, "SELECT escalation_id FROM unresolved_escalations") == [("esc-9",)]
    assert query_one(db, "SELECT status, steps, in_doubt, events FROM workflows") == [
        ("running", 6, 1, len(log))
    ]
    stored = query_one(db, "SELECT sum(next_offset) FROM offsets")[0][0]
    assert stored == len(log)


def test_duplicates_and_redelivered_batches_change_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    log = random_log(seed=21, workflows=30)
    db = tmp_path / "p.duckdb"
    with projecting(settings, db) as daemon:
        daemon.wait_received(produce_events(settings, log))
    first = table_contents(db)
    # Redelivery: forget the stored offsets, so every record arrives a second time ...
    with ProjectionStore(db) as store:
        store.con.execute("UPDATE offsets SET next_offset = 0")
    # ... and a retried produce: the whole log appended again at new offsets.
    with projecting(settings, db) as daemon:
        daemon.wait_received(2 * produce_events(settings, log))
    again = table_contents(db)
    for table in ("events", "steps", "workflows", "escalations", "anomalies"):
        assert again[table] == first[table], table
    assert query_one(db, "SELECT sum(next_offset) FROM offsets")[0][0] == 2 * len(log)
    grouped: dict[str, list[ev.Event]] = defaultdict(list)
    for event in log:
        grouped[event.workflow_id].append(event)
    expected = [
        step_row(s, st)
        for w, es in grouped.items()
        for s in [replay(w, es)]
        for st in s.steps.values()
    ]
    assert query_one(db, "SELECT * FROM steps ORDER BY ALL") == sorted(expected)


def poison(settings: Settings) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]:
    """One record of each kind the projector must refuse, with headers to be copied."""
    codec = Codec()
    good = codec.encode(
        factory().workflow_started("wf-x", name="", attempt=1, read_only=False, max_attempts=1)
    )
    invalid = ev.WorkflowStarted.model_construct(
        name="", attempt=0, read_only=False, max_attempts=1
    )
    bad_event = factory().workflow_started(
        "wf-y", name="", attempt=1, read_only=False, max_attempts=1
    )
    model_invalid = codec.encode(bad_event.model_copy(update={"body": invalid}))
    return [
        (b"k-decode", b"\xc3\x01" + good[2:10] + b"\xff\xff\xff", [("h", b"1")]),
        (b"k-schema", SINGLE_OBJECT_MAGIC + b"\x00" * 8 + good[10:], [("h", b"2")]),
        (b"k-validate", model_invalid, [("h", b"3")]),
        (b"k-empty", None, [("h", b"4")]),
    ]


def test_poison_goes_to_the_dead_letter_topic_and_good_events_around_it_project(
    settings: Settings, tmp_path: Path
) -> None:
    f = factory()
    before = [f.workflow_started("a", name="", attempt=1, read_only=False, max_attempts=1)]
    after = [f.intent("a", "s", PAY, {}, sequence=0)]
    db = tmp_path / "p.duckdb"
    bad = poison(settings)
    with projecting(settings, db, group="poison-group") as daemon:
        produce_events(settings, before)
        produce_raw(settings, bad)
        produce_events(settings, after)
        daemon.wait_received(len(before) + len(bad) + len(after))
    assert query_one(db, "SELECT step_id, status FROM steps") == [("s", "intended")]
    assert query_one(db, "SELECT count(*) FROM events") == [(2,)]
    letters = list(read_topic(settings, Codec(), topic=settings.dlq_topic, idle_timeout=0.3))
    by_key = {r.key: r for r in letters}
    assert set(by_key) == {b"k-decode", b"k-schema", b"k-validate", b"k-empty"}
    stages = {k: dead_letter_info(r.headers)["stage"] for k, r in by_key.items()}
    assert stages == {
        b"k-decode": "decode",
        b"k-schema": "schema",
        b"k-validate": "validate",
        b"k-empty": "decode",
    }
    for key, value, headers in bad:
        letter = by_key[key]
        info = dead_letter_info(letter.headers)
        assert (letter.value or b"") == (value or b"")
        assert original_headers(letter.headers) == headers
        assert info["topic"] == settings.topic and info["group"] == "poison-group"
        assert info["partition"].isdigit() and info["offset"].isdigit() and info["error"]
    assert "attempt" in dead_letter_info(by_key[b"k-validate"].headers)["error"]
    stored = query_one(db, "SELECT sum(next_offset) FROM offsets")[0][0]
    assert stored == len(before) + len(bad) + len(after)


def test_several_topics_project_into_one_file(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings()
    other = make_settings()
    log = random_log(seed=4, workflows=6)
    half = len({e.workflow_id for e in log}) // 2
    ids = sorted({e.workflow_id for e in log})[:half]
    mine = [e for e in log if e.workflow_id in ids]
    theirs = [e for e in log if e.workflow_id not in ids]
    db = tmp_path / "p.duckdb"
    with projecting(settings, db, topics=(settings.topic, other.topic)) as daemon:
        produce_events(settings, mine)
        produce_events(other, theirs)
        daemon.wait_received(len(log))
    topics = {t for (t,) in query_one(db, "SELECT DISTINCT topic FROM offsets")}
    assert topics == {settings.topic, other.topic}
    assert query_one(db, "SELECT count(DISTINCT workflow_id) FROM workflows") == [
        (len(set(e.workflow_id for e in log)),)
    ]


class FailingStore(ProjectionStore):
    """A store whose disk fails on the first batch."""

    def write(self, *args: Any, **kwargs: Any) -> None:
        raise ViewStoreError("projection write failed: IO Error: disk full")


def test_a_fatal_duckdb_error_stops_the_daemon_with_the_error(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stepledger.projector.daemon.ProjectionStore", FailingStore)
    produce_events(settings, saga_log()[:2])
    with pytest.raises(ViewStoreError, match="disk full"):
        run_projector(
            settings,
            ProjectorOptions(db_path=tmp_path / "p.duckdb", group=f"projector-{settings.topic}"),
            shutdown=Shutdown(),
        )

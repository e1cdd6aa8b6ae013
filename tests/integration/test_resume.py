"""Resume against the real broker: workflow readers, snapshot+tail, approval gates via the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import SagaViolationError
from stepledger.history.adapt import as_history
from stepledger.history.kafka import KafkaHistory
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import WorkflowHistory
from stepledger.kafka import Position, topic_partitions
from stepledger.kafka.partitioner import partition_of
from stepledger.kafka.reader import read_topic
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger, SnapshotTailReader
from stepledger.projector.rebuild import rebuild
from stepledger_dev.examples.clients import RunningService, start_service

CLI = [sys.executable, "-m", "stepledger"]
AGENT = [sys.executable, "-m", "stepledger_dev.examples.trip_agent"]
READ = Tool(name="read", effect="read_only")
PAY = Tool(name="pay", effect="idempotent", keyed=True)
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: None)
EMAIL = Tool(name="email", effect="irreversible")


def record_workflows(ledger: Ledger, ids: list[str], steps: int = 3) -> None:
    for wf_id in ids:
        wf = ledger.workflow(wf_id)
        for i in range(steps):
            wf.step(f"s{i}", PAY, {"i": i}, lambda a, k: {"key": k})


# -- the history contract: both implementations and the snapshot reader -----------------------


@pytest.fixture(params=["memory", "scan", "snapshot"])
def reader_setup(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Any:
    """(ledger to write with, reader factory called after the writes)."""
    if request.param == "memory":
        log = InMemoryEventLog()
        ledger = Ledger(settings, log=log)
        return ledger, lambda: InMemoryHistory(log)
    ledger = Ledger(settings)
    if request.param == "scan":
        return ledger, lambda: KafkaHistory(settings)
    db = tmp_path / "ledger.duckdb"

    def snapshot_then_tail() -> WorkflowHistory:
        rebuild(settings, db)  # the snapshot holds what was written so far ...
        record_workflows(ledger, ["wf-a", "wf-late"], steps=5)  # ... the tail holds the rest
        return as_history(SnapshotTailReader(settings, db))

    return ledger, snapshot_then_tail


def test_a_reader_returns_one_workflows_events_in_log_order(reader_setup: Any) -> None:
    ledger, make_reader = reader_setup
    record_workflows(ledger, ["wf-a", "wf-b", "wf-c"])
    reader = make_reader()
    events = reader.read("wf-a").events
    assert {e.workflow_id for e in events} == {"wf-a"}
    state = replay("wf-a", events)
    assert not state.anomalies and all(
        s.status is StepStatus.SUCCEEDED for s in state.steps.values()
    )
    assert [e.type for e in events[:3]] == ["workflow_started", "step_intended", "step_outcome"]
    assert reader.read("wf-none").events == []
    ledger.close()


def test_a_reader_follows_a_workflow_after_a_position(reader_setup: Any) -> None:
    ledger, make_reader = reader_setup
    wf = ledger.workflow("wf-f")
    reader = make_reader()
    after = wf.position
    assert isinstance(after, Position)
    wf.step("s", PAY, {}, lambda a, k: 1)
    found = reader.follow("wf-f", after, lambda e: e.type == "step_outcome", timeout_s=10)
    assert [e.type for e in found] == ["step_intended", "step_outcome"]
    began = time.monotonic()
    assert reader.follow("wf-f", wf.position, lambda e: True, timeout_s=0.3) == []
    assert time.monotonic() - began < 5
    ledger.close()


def test_the_snapshot_reader_reads_the_tail_only(settings: Settings, tmp_path: Path) -> None:
    db = tmp_path / "ledger.duckdb"
    with Ledger(settings) as ledger:
        record_workflows(ledger, [f"old-{i}" for i in range(20)])
        rebuild(settings, db)
        resumed = ledger.workflow("old-3")
        for i in range(3):
            resumed.step(f"s{i}", PAY, {"i": i}, lambda a, k: 1)
        resumed.step("t", PAY, {}, lambda a, k: 1)
        record_workflows(ledger, ["new-1"], steps=1)
    reader = SnapshotTailReader(settings, db)
    events = reader.read("old-3")
    stats = reader.last
    assert stats.snapshot_events == 7 and stats.tail_events == 3
    # Only the records after the snapshot, and only in old-3's own partition, were scanned.
    parts = len(topic_partitions(settings, settings.topic))
    same = partition_of(b"new-1", parts) == partition_of(b"old-3", parts)
    assert stats.tail_records == 3 + (3 if same else 0)
    assert len(events) == 10 and len({e.event_id for e in events}) == 10
    assert [e.type for e in events[7:]] == ["workflow_resumed", "step_intended", "step_outcome"]


def test_without_a_snapshot_the_reader_scans(settings: Settings, tmp_path: Path) -> None:
    with Ledger(settings) as ledger:
        record_workflows(ledger, ["wf-1"])
    reader = SnapshotTailReader(settings, tmp_path / "never-projected.duckdb")
    assert len(reader.read("wf-1")) == 7 and reader.last.snapshot is None


# -- the SDK on the real broker ------------------------------------------------------------


def test_a_resume_through_the_snapshot_reader_replays_without_calls(
    settings: Settings, tmp_path: Path
) -> None:
    db = tmp_path / "ledger.duckdb"
    calls: list[str] = []

    def pay(args: dict[str, Any], key: str) -> dict[str, str]:
        calls.append(key)
        return {"paid": key}

    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-r")
        wf.step("pay", PAY, {"amount": 3}, pay)
    rebuild(settings, db)
    with Ledger(settings, reader=SnapshotTailReader(settings, db)) as ledger:
        wf = ledger.workflow("wf-r")
        assert wf.attempt == 2
        assert wf.step("pay", PAY, {"amount": 3}, lambda a, k: calls.append(k))["paid"] == calls[0]
        wf.step("read", READ, {}, lambda a, k: "r")
        wf.finish()
    assert len(calls) == 1
    events = [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]
    assert replay("wf-r", [e for e in events if e is not None]).status is RunStatus.COMPLETED


def test_a_pivot_first_plan_is_refused_before_anything_is_recorded(settings: Settings) -> None:
    with Ledger(settings) as ledger:
        with pytest.raises(SagaViolationError, match="undoable_after_pivot"):
            ledger.workflow("wf-p", plan=[("mail", EMAIL), ("book", BOOK)])
        wf = ledger.workflow("wf-q")
        wf.step("mail", EMAIL, {}, lambda a, k: "sent")
        with pytest.raises(SagaViolationError, match="pivot_passed"):
            wf.step("book", BOOK, {}, lambda a, k: "booked")
    events = [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]
    assert {e.workflow_id for e in events if e is not None} == {"wf-q"}


# -- approval gates through the CLI and the example agent ---------------------------------


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, RunningService]]:
    running = {
        k: start_service(k, tmp_path / f"{k}.sqlite") for k in ("payments", "bookings", "email")
    }
    try:
        yield running
    finally:
        for service in running.values():
            service.stop()


def agent_env(
    settings: Settings, services: dict[str, RunningService], base: dict[str, str]
) -> dict[str, str]:
    return {
        **base,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_PAYMENTS_URL": services["payments"].url,
        "STEPLEDGER_BOOKINGS_URL": services["bookings"].url,
        "STEPLEDGER_EMAIL_URL": services["email"].url,
        "STEPLEDGER_TOOL_TIMEOUT_S": "1.0",
    }


def email_count(services: dict[str, RunningService]) -> int:
    from stepledger_dev.examples.clients import EmailClient

    return EmailClient(services["email"].url).effect_count("email")


def wait_for_event(settings: Settings, kind: str, timeout: float = 30) -> ev.Event:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in read_topic(settings, Codec(), idle_timeout=0.1, max_time=5):
            if record.event is not None and record.event.type == kind:
                return record.event
    raise AssertionError(f"no {kind} event within {timeout}s")


def test_an_approval_gate_blocks_until_approved_on_the_command_line(
    settings: Settings, services: dict[str, RunningService], src_env: dict[str, str]
) -> None:
    env = agent_env(settings, services, src_env)
    agent = subprocess.Popen(
        [*AGENT, "trip-gated", "--approval", "--approval-wait", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        request = wait_for_event(settings, "approval_requested")
        assert request.step_id == "email"
        assert agent.poll() is None and email_count(services) == 0, "blocked at the gate"
        early = subprocess.run(
            [*CLI, "approve", "trip-gated", "charge", "--by", "qa"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert early.returncode == 1 and "awaits no approval" in early.stderr
        assert len(early.stderr.strip().splitlines()) == 1
        approved = subprocess.run(
            [*CLI, "approve", "trip-gated", "email", "--by", "qa", "--note", "looks right"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert approved.returncode == 0, approved.stderr
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "completed"
    assert email_count(services) == 1


def test_a_denied_step_never_runs_and_a_pending_agent_can_exit(
    settings: Settings, services: dict[str, RunningService], src_env: dict[str, str]
) -> None:
    env = agent_env(settings, services, src_env)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*args], env=env, capture_output=True, text=True, timeout=60)

    pending = run(*AGENT, "trip-denied", "--approval")
    assert pending.returncode == 3
    assert json.loads(pending.stdout.splitlines()[-1])["status"] == "approval_pending"
    denied = run(*CLI, "deny", "trip-denied", "email", "--by", "qa")
    assert denied.returncode == 0, denied.stderr
    # A second person answering the same case is told who answered first; nothing appended.
    again = run(*CLI, "approve", "trip-denied", "email", "--by", "bo")
    assert again.returncode == 1
    assert again.stderr.startswith("Error: already answered by qa at ")
    assert len(again.stderr.strip().splitlines()) == 1
    after = run(*AGENT, "trip-denied", "--approval")
    report = json.loads(after.stdout.splitlines()[-1])
    assert report["status"] == "error" and "ApprovalDeniedError" in report["error"]
    assert email_count(services) == 0
    shown = run(*CLI, "workflows", "show", "trip-denied", "--json")
    summary = json.loads(shown.stdout)
    assert summary["steps"][-1] == {
        "step_id": "email",
        "tool": "email.send",
        "status": "denied",
        "result": None,
    }

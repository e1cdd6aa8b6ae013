"""The recovery daemon against hostile input and hostile operations, as real processes.

Poison events (a far-future deadline, a workflow restart carrying a step's id, arguments
that are not JSON) never stop the daemon or its checkpoint; cooperative rebalancing works;
a daemon paused past its session timeout appends nothing for partitions it lost; a daemon
pointed at no broker or no topic fails in one line.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.deadletters.letter import dead_letter_info
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepState, StepStatus
from stepledger.kafka import ensure_topics
from stepledger.kafka.reader import read_topic
from stepledger.log import codec_for
from stepledger_dev.broker import LocalBroker, free_port
from stepledger_dev.examples.tools import payments_tool
from tests.conftest import Factory
from tests.e2e.recovery_helpers import (
    CLI,
    LogWatcher,
    Stack,
    append_events,
    group_of,
    services_stack,
    stop,
    wait_for,
)

pytestmark = pytest.mark.e2e
CHARGE = {"amount": 300, "currency": "EUR", "customer": "cus_h"}
FAR_FUTURE = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with services_stack(tmp_path_factory.mktemp("recovery-hostile")) as stack:
        yield stack


def _intent(stack: Stack, factory: EventFactory, workflow: str, **changes: object) -> ev.Event:
    tool = payments_tool(stack.services["payments"].url, timeout_s=1.0)
    intent = factory.intent(workflow, "s", tool, CHARGE, sequence=0)
    body = intent.body.model_copy(update=changes)
    return intent.model_copy(update={"body": body})


def test_poison_events_never_stop_the_daemon_or_its_checkpoint(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    factory = EventFactory(settings.fleet_id, "agent")
    run = uuid.uuid4().hex[:6]
    far = _intent(stack, factory, f"far-{run}", deadline=FAR_FUTURE)
    restarted = _intent(stack, factory, f"restart-{run}")
    restart = factory.workflow_started(
        f"restart-{run}", name="", attempt=2, read_only=True, max_attempts=3
    ).model_copy(update={"step_id": "s"})
    garbage = _intent(stack, factory, f"garbage-{run}", arguments_json="{not json")
    good = _intent(stack, factory, f"good-{run}")
    append_events(settings, [far, restarted, restart, garbage, good])
    state_dir = tmp_path / "state"
    daemon = stack.start_daemon(settings, state_dir)
    watcher = LogWatcher(settings)
    try:
        decided = wait_for(
            lambda: (s := watcher.step(f"good-{run}")) and s.status is StepStatus.SUCCEEDED,
            30,
            "the good intent to be resolved next to the poison",
        )
        assert decided
        garbage_step = wait_for(
            lambda: _escalated(watcher, f"garbage-{run}"),
            60,
            "the non-JSON intent to be abandoned at max_attempts",
        )
        assert garbage_step.status is StepStatus.ABANDONED
        assert garbage_step.recovery_attempts == 3
        assert daemon.poll() is None
        # The shutdown checkpoint holds the far-future step; a restart loads it and goes on.
        assert stop(daemon) == 0
        stack.daemons.remove(daemon)
        again = stack.start_daemon(settings, state_dir)
        later = _intent(stack, factory, f"later-{run}")
        append_events(settings, [later])
        wait_for(
            lambda: (s := watcher.step(f"later-{run}")) and s.status is StepStatus.SUCCEEDED,
            30,
            "an intent after the restart to be resolved",
        )
        assert again.poll() is None
        far_step = watcher.step(f"far-{run}")
        assert far_step is not None and far_step.status is StepStatus.INTENDED
    finally:
        watcher.close()
    letters = [
        r
        for r in read_topic(settings, codec_for(settings), topic=settings.dlq_topic, max_time=10)
        if r.event is not None and r.event.workflow_id == f"garbage-{run}"
    ]
    assert letters, "the abandoned poison intent has a dead letter"
    info = dead_letter_info(letters[0].headers)
    assert info["stage"] == "recovery" and "3 recovery attempts" in info["error"]


def test_cooperative_sticky_assignment_works(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=2)
    coop = "cooperative-sticky"
    first = stack.start_daemon(
        settings, tmp_path / "a", STEPLEDGER_KAFKA_PARTITION_ASSIGNMENT_STRATEGY=coop
    )
    second = stack.start_daemon(
        settings, tmp_path / "b", STEPLEDGER_KAFKA_PARTITION_ASSIGNMENT_STRATEGY=coop
    )
    factory = EventFactory(settings.fleet_id, "agent")
    workflows = [f"coop-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    append_events(settings, [_intent(stack, factory, wf) for wf in workflows])
    watcher = LogWatcher(settings)
    try:
        _wait_succeeded(watcher, workflows, 30)
    finally:
        watcher.close()
    assert first.poll() is None and second.poll() is None


def test_a_daemon_paused_past_its_session_appends_nothing_for_partitions_it_lost(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=2)
    slow = {"tools": "tests.e2e.recovery_slow_tools:slow_redrive_registry"}
    paused = stack.start_daemon(
        settings, tmp_path / "a", tools=slow["tools"], STEPLEDGER_RECOVERY_WORKERS="1"
    )
    factory = EventFactory(settings.fleet_id, "agent")
    workflows = [f"paused-{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    append_events(settings, [_intent(stack, factory, wf) for wf in workflows])
    watcher = LogWatcher(settings)
    try:
        # Work is queued and running in the first daemon (one worker, a 1 s re-drive each).
        wait_for(
            lambda: any(
                isinstance(e.body, ev.ResolutionAttempted) for e in watcher.refresh().events
            ),
            30,
            "the first daemon to start resolving",
        )
        paused.send_signal(signal.SIGSTOP)
        stopped_at = datetime.now(UTC)
        taker = stack.start_daemon(settings, tmp_path / "b", tools=slow["tools"])
        _wait_succeeded(watcher, workflows, 60)
        paused.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        # Give the woken daemon time to do its worst: finish its queued and running work.
        wait_for(lambda: time.monotonic() - resumed_at > 6, 10, "six seconds", every=0.5)
        events = watcher.refresh().events
    finally:
        watcher.close()
    assert paused.poll() is None and taker.poll() is None
    paused_id = f"{socket.gethostname()}:{paused.pid}"
    late = [
        e
        for e in events
        if e.producer_id == paused_id and e.occurred_at > stopped_at and e.workflow_id in workflows
    ]
    assert late == [], [f"{e.type} {e.workflow_id}" for e in late]
    outcomes = [e for e in events if isinstance(e.body, ev.StepOutcome)]
    assert sorted(e.workflow_id for e in outcomes) == sorted(workflows)
    assert all(e.body.source is Source.RECOVERY_REDRIVE for e in outcomes)  # type: ignore[union-attr]


def _start_projector(
    stack: Stack, settings: Settings, db: Path, log: Path
) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(
        [sys.executable, "-m", "stepledger", "project", "--db", str(db), "--session-timeout", "2",
         "--log-format", "json", "--group", f"projector-{settings.topic}"],
        env=stack.env(settings), stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out.close()
    wait_for(lambda: "assigned" in log.read_text(), 30, "the projector to own its partition")
    return process


def _escalated(watcher: LogWatcher, workflow: str) -> StepState | None:
    step = watcher.step(workflow)
    return step if step is not None and step.escalation_open else None


def _wait_succeeded(watcher: LogWatcher, workflows: list[str], timeout: float) -> None:
    def done() -> bool:
        steps = [watcher.step(wf) for wf in workflows]
        return all(s is not None and s.status is StepStatus.SUCCEEDED for s in steps)

    wait_for(done, timeout, f"{len(workflows)} intents to be resolved")


@pytest.mark.parametrize("what", ["no broker", "no topic", "session past the client's range"])
def test_recover_without_a_broker_or_topic_fails_in_one_line(
    what: str, settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}" if what == "no broker" else settings.bootstrap
    topic = settings.topic if what != "no topic" else f"missing-{uuid.uuid4().hex[:8]}"
    # librdkafka refuses a session timeout above max.poll.interval.ms (300 s by default).
    session = ["--session-timeout", "400s"] if what.startswith("session") else []
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CLI,
            "recover",
            "--tools",
            "stepledger_dev.examples.tools:registry",
            "--no-entry-points",
            "--state-dir",
            str(tmp_path),
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            *session,
        ],
        env={**src_env, "STEPLEDGER_PAYMENTS_URL": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.kafka_only  # the dev broker (Tansu) lists no consumer groups
def test_a_second_recovery_group_on_the_same_topic_is_warned_about_loudly(
    stack: Stack, make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    stack.start_daemon(settings, tmp_path / "a")
    log = tmp_path / "b.log"
    other = stack.start_daemon(settings, tmp_path / "b", log=log, group=f"other-{settings.topic}")
    assert other.poll() is None
    assert "other recovery groups follow this topic" in log.read_text()


def test_a_broker_outage_is_one_line_each_way_and_health_says_so(
    stack: Stack, tmp_path: Path
) -> None:
    broker = LocalBroker(log_path=tmp_path / "broker.log").start()
    try:
        settings = Settings(
            bootstrap=broker.bootstrap, topic="outage", dlq_topic="outage-dlq", fleet_id="f"
        )
        ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=1)
        state_dir, log = tmp_path / "state", tmp_path / "recovery.log"
        daemon = stack.start_daemon(settings, state_dir, log=log)
        projector_log = tmp_path / "projector.log"
        projector = _start_projector(stack, settings, tmp_path / "p.duckdb", projector_log)
        broker.stop()  # the broker is gone (its memory storage with it)
        wait_for(lambda: "broker unreachable" in log.read_text(), 30, "the outage line")
        wait_for(lambda: "broker unreachable" in projector_log.read_text(), 30, "its line")

        def unhealthy() -> subprocess.CompletedProcess[str] | None:
            health = subprocess.run(
                [sys.executable, "-c", CLI, "recover-health", "--state-dir", str(state_dir),
                 "--group", group_of(settings)],
                env=stack.env(settings), capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return health if health.returncode != 0 else None

        health = wait_for(unhealthy, 20, "recover-health to report the outage")
        time.sleep(6)  # not a wait for a condition: the outage itself lasts several seconds
        broker.restart()
        ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=1)
        wait_for(lambda: "broker reachable again" in log.read_text(), 30, "the recovery line")
        wait_for(lambda: "broker reachable again" in projector_log.read_text(), 30, "its line")
        assert daemon.poll() is None and projector.poll() is None
        logs = {"recovery": log.read_text(), "projector": projector_log.read_text()}
    finally:
        broker.stop()
        stop(projector)
    for text in logs.values():
        lines = text.splitlines()
        assert sum("broker unreachable" in line for line in lines) == 1
        assert sum("broker reachable again" in line for line in lines) == 1
        # librdkafka's own lines are rate-limited: a handful, not hundreds.
        assert sum('"level": "error"' in line for line in lines) < 15, len(lines)
    assert health.returncode == 1 and "cannot reach the broker" in health.stderr

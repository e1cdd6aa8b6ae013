"""Helpers of the recovery crash tests: services, daemon and agent processes, log folding."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from stepledger.cli._common import run_guarded
from stepledger.cli._recovery import register
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.domain.state import StepState, WorkflowState
from stepledger.kafka import topic_partitions
from stepledger.kafka.consumer import FAST_CONSUMER
from stepledger.kafka.reader import read_topic
from stepledger.log import KafkaEventLog, codec_for
from stepledger_dev.examples.clients import RunningService, start_service

ROOT = Path(__file__).resolve().parents[2]
# The recovery commands in a group of their own, run through the CLI's error boundary, so
# these tests do not depend on other areas' commands importing cleanly.
CLI = (
    "import sys, click; from stepledger.cli._common import run_guarded; "
    "from stepledger.cli._recovery import register; g = click.Group('stepledger'); "
    "register(g); sys.exit(run_guarded(g))"
)
TOOL_TIMEOUT_S = 1.0
GRACE_S = 0.5
T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.2) -> T:
    """Poll until ``check`` returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def read_events(settings: Settings, topic: str | None = None) -> list[Event]:
    """Every decodable event of the topic, in log order per partition."""
    records = read_topic(settings, codec_for(settings), topic=topic, idle_timeout=0.2, max_time=30)
    return [r.event for r in records if r.event is not None]


def group_of(settings: Settings) -> str:
    """The recovery consumer group a test's daemons share (unique to the test's topic)."""
    return f"recovery-{settings.topic}"


class LogWatcher:
    """Follows a topic with one assigned consumer and keeps its fold up to date (cheap polls)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.codec = codec_for(settings)
        self.events: list[Event] = []
        self.states: dict[str, WorkflowState] = {}
        config = {**FAST_CONSUMER, "group.id": "test-watcher", "fetch.wait.max.ms": 10}
        self._consumer = Consumer(settings.client_config(**config))
        parts = topic_partitions(settings, settings.topic)
        self._consumer.assign([TopicPartition(settings.topic, p, OFFSET_BEGINNING) for p in parts])
        self._partitions = set(parts)
        self._at_end: set[int] = set()

    def refresh(self, max_time: float = 5.0) -> LogWatcher:
        """Read what is there now, up to the end of every partition (bounded in time)."""
        deadline = time.monotonic() + max_time
        while time.monotonic() < deadline:
            batch = self._consumer.consume(500, 0.05)
            for msg in batch:
                self._take(msg)
            if not batch and self._at_end == self._partitions:
                break
        return self

    def _take(self, msg: Any) -> None:
        err = msg.error()
        partition = int(msg.partition() or 0)
        if err is not None:
            # The end is reported once per arrival at it, so it is remembered until new data.
            if err.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(partition)
            return
        self._at_end.discard(partition)
        event = self.codec.decode(msg.value())
        self.events.append(event)
        wf = event.workflow_id
        self.states.setdefault(wf, WorkflowState(wf)).apply(event)

    def step(self, workflow: str, step: str = "s") -> StepState | None:
        """One step as the log tells it now."""
        state = self.refresh().states.get(workflow)
        return None if state is None else state.steps.get(step)

    def of(self, workflow: str) -> list[Event]:
        """The events of one workflow read so far (after a refresh)."""
        return [e for e in self.refresh().events if e.workflow_id == workflow]

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


@dataclass
class Stack:
    """The example services and the environment agents and daemons share."""

    services: dict[str, RunningService]
    base_env: dict[str, str]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, settings: Settings, **extra: str) -> dict[str, str]:
        """Environment for a stepledger subprocess on these settings and services."""
        path = os.pathsep.join([str(ROOT / "src"), str(ROOT), self.base_env.get("PYTHONPATH", "")])
        return {
            **self.base_env,
            "PYTHONPATH": path,
            "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
            "STEPLEDGER_TOPIC": settings.topic,
            "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
            "STEPLEDGER_FLEET_ID": settings.fleet_id,
            "STEPLEDGER_PAYMENTS_URL": self.services["payments"].url,
            "STEPLEDGER_BOOKINGS_URL": self.services["bookings"].url,
            "STEPLEDGER_EMAIL_URL": self.services["email"].url,
            "STEPLEDGER_TOOL_TIMEOUT_S": str(TOOL_TIMEOUT_S),
            "STEPLEDGER_TOOL_MAX_ATTEMPTS": "3",
            **extra,
        }

    def start_daemon(
        self,
        settings: Settings,
        state_dir: Path,
        *,
        tools: str = "stepledger_dev.examples.tools:registry",
        log: Path | None = None,
        group: str | None = None,
        **extra_env: str,
    ) -> subprocess.Popen[bytes]:
        """Start ``stepledger recover`` and wait until it owns partitions and caught up."""
        command = [
            sys.executable,
            "-c",
            CLI,
            "recover",
            "--tools",
            tools,
            "--no-entry-points",
            "--state-dir",
            str(state_dir),
            "--grace",
            f"{GRACE_S}s",
            "--session-timeout",
            "2s",
            "--log-format",
            "json",
            # One group per test topic: tests share the broker, and a group that spans tests
            # would wait on other tests' (possibly SIGKILLed) members at every rebalance.
            "--group",
            group or group_of(settings),
        ]
        out = open(log or state_dir.with_suffix(".log"), "ab")  # noqa: SIM115 - child owns it
        process = subprocess.Popen(
            command, env=self.env(settings, **extra_env), stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self.daemons.append(process)
        health = state_dir / f"health-{group or group_of(settings)}.json"

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"daemon exited with {process.returncode}")
            try:
                beat = json.loads(health.read_text())
            except (OSError, ValueError):
                return False
            return bool(beat["partitions"]) and set(beat["partitions"]) <= set(beat["caught_up"])

        wait_for(ready, 30, "the recovery daemon to own partitions and catch up")
        return process

    def stop_daemons(self) -> None:
        """SIGTERM every daemon still running and wait for it."""
        for process in self.daemons:
            stop(process)
        self.daemons.clear()

    def run_agent(
        self,
        settings: Settings,
        tool: str,
        workflow: str,
        step: str,
        arguments: dict[str, Any],
        *,
        kill: str | None = None,
        slow: float = 0.0,
        fault: str | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run the example agent for one step (optionally dying at a kill point); ``env``
        adds to (or overrides) the stack's environment."""
        command = [
            sys.executable,
            "-m",
            "stepledger_dev.examples.agent",
            "--tool",
            tool,
            "--workflow",
            workflow,
            "--step",
            step,
            "--args",
            json.dumps(arguments),
        ]
        if kill:
            command += ["--kill", kill]
        if slow:
            command += ["--slow", str(slow)]
        if fault:
            command += ["--fault", fault]
        process = subprocess.Popen(
            command,
            env=self.env(settings, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if wait:
            process.wait(timeout=60)
        return process


def stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> int:
    """SIGTERM a process, SIGKILL it after ``grace`` seconds; return its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=10)


@dataclass(frozen=True)
class CliResult:
    """What a CLI run printed and returned."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(env: dict[str, str], *args: str) -> CliResult:
    """Run the recovery commands in-process with CliRunner, through the CLI's error boundary."""
    group = click.Group("stepledger")
    register(group)
    runner = CliRunner()
    argv = sys.argv
    with runner.isolation(env=env) as (out, err, _):
        sys.argv = ["stepledger", *args]
        try:
            code = run_guarded(group)
        finally:
            sys.argv = argv
    return CliResult(code, out.getvalue().decode(), err.getvalue().decode())


def append_events(settings: Settings, events: list[Event]) -> None:
    """Append events durably, one after the other, as agents would."""
    log = KafkaEventLog(settings)
    try:
        for event in events:
            log.append(event)
    finally:
        log.close()


@contextlib.contextmanager
def services_stack(base: Path) -> Iterator[Stack]:
    """The three example services in ``base`` and a Stack over them; all stopped after."""
    services = {
        kind: start_service(kind, base / f"{kind}.sqlite")
        for kind in ("payments", "bookings", "email")
    }
    stack = Stack(services, dict(os.environ))
    try:
        yield stack
    finally:
        stack.stop_daemons()
        for service in services.values():
            service.stop()

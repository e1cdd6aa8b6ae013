"""Each real daemon's /healthz and /readyz, before and after it is ready (real broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import checkpoint_topic_config
from stepledger_dev.broker import free_port

TOKEN = "probe-token-" + "x" * 16


def _get(port: int, path: str) -> tuple[int, str] | None:
    """The answer, or None while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except OSError:
        return None


def _first_answer(
    port: int, process: subprocess.Popen[str], timeout: float = 20
) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-2000:]
        answer = _get(port, "/readyz")
        if answer is not None:
            return answer
        time.sleep(0.02)
    raise AssertionError("the probe port never answered")


def _until_ready(port: int, process: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    answer = None
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-2000:]
        answer = _get(port, "/readyz")
        if answer == (200, "ok"):
            return
        time.sleep(0.1)
    raise AssertionError(f"never ready: last answer {answer}")


@contextmanager
def _daemon(args: list[str], settings: Settings, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_CHECKPOINT_TOPIC": settings.checkpoint_topic,
        "STEPLEDGER_INBOX_TOKEN": TOKEN,
        "STEPLEDGER_TOOLS": "stepledger_dev.examples.tools:registry",
        "STEPLEDGER_PAYMENTS_URL": "http://127.0.0.1:1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "stepledger", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


COMMANDS = {
    "projector": ["project", "--db", "p.duckdb", "--metrics-port", "{port}"],
    "recovery": ["recover", "--state-dir", "r", "--grace", "1s", "--metrics-port", "{port}"],
    "checkpointer": ["checkpoint", "--every", "2", "--metrics-port", "{port}"],
}


@pytest.mark.parametrize("daemon", sorted(COMMANDS))
def test_a_daemon_is_alive_at_once_and_ready_once_its_partitions_are_read(
    daemon: str, settings: Settings, tmp_path: Path
) -> None:
    config = {settings.checkpoint_topic: checkpoint_topic_config()}
    ensure_topics(settings, [settings.checkpoint_topic], partitions=3, configs=config)
    port = free_port()
    args = [a.format(port=port) for a in COMMANDS[daemon]]
    with _daemon(args, settings, tmp_path) as process:
        status, reason = _first_answer(port, process)
        # Bound before the daemon reaches the broker: alive, not ready, and saying why.
        assert status == 503, reason
        assert "starting" in reason or "no partitions assigned" in reason, reason
        assert _get(port, "/healthz") == (200, "ok")
        _until_ready(port, process)
        assert _get(port, "/healthz") == (200, "ok")


def test_the_inbox_is_ready_once_its_queue_can_be_read(settings: Settings, tmp_path: Path) -> None:
    port, inbox_port = free_port(), free_port()
    inbox = ["inbox", "--db", "p.duckdb", "--port", str(inbox_port), "--metrics-port", str(port)]
    with _daemon(inbox, settings, tmp_path) as process:
        # No projection yet: nothing to read the queue from (after "starting").
        status, reason = _first_answer(port, process)
        assert status == 503, reason
        deadline = time.monotonic() + 20
        while "cannot read its queue" not in reason and time.monotonic() < deadline:
            status, reason = _get(port, "/readyz") or (0, "")
            time.sleep(0.05)
        assert status == 503 and "cannot read its queue" in reason, reason
        assert _get(port, "/healthz") == (200, "ok")
        with _daemon(["project", "--db", "p.duckdb"], settings, tmp_path):
            _until_ready(port, process)
        assert _get(port, "/healthz") == (200, "ok")

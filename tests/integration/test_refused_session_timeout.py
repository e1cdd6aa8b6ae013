"""A session timeout the broker refuses stops a daemon with one line, instead of a silent loop.

Apache Kafka bounds a classic group's session timeout (``group.min.session.timeout.ms``,
6 s by default).  librdkafka retries the refused JoinGroup forever, so each daemon ran
without ever being assigned a partition.  These tests run their own Apache Kafka node with
that default (the test broker allows 1 s sessions).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.kafka import ensure_topics
from stepledger_dev.apache_kafka import KafkaBroker

CLI = [sys.executable, "-m", "stepledger"]
#: Below Kafka's default group.min.session.timeout.ms (6 s).
REFUSED = "2"

pytestmark = [
    pytest.mark.kafka_only,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs java"),
]


@pytest.fixture(scope="module")
def default_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("kafka-defaults")
    overrides = {"group.min.session.timeout.ms": "6000"}
    with KafkaBroker(log_dir=logs, server_overrides=overrides) as kafka:
        yield kafka.bootstrap


@pytest.fixture
def settings(default_kafka: str) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    made = Settings(bootstrap=default_kafka, topic=f"events-{suffix}", dlq_topic=f"dlq-{suffix}")
    ensure_topics(made, [made.topic, made.dlq_topic])
    return made


def _run(settings: Settings, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    return subprocess.run(
        [*CLI, *args, *where, "--dlq-topic", settings.dlq_topic],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_projector_stops_on_a_refused_session_timeout(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    db = f"{tmp_path}/ledger.duckdb"
    done = _run(settings, src_env, "project", "--db", db, "--session-timeout", REFUSED)
    assert "session timeout" in _one_line_error(done)


def test_recovery_stops_on_a_refused_session_timeout(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**src_env, "STEPLEDGER_PAYMENTS_URL": "http://127.0.0.1:9"}
    done = _run(
        settings,
        env,
        "recover",
        "--tools",
        "stepledger_dev.examples.tools:registry",
        "--no-entry-points",
        "--state-dir",
        f"{tmp_path}/state",
        "--metrics-port",
        "0",
        "--group",
        f"recovery-{settings.topic}",
        "--session-timeout",
        f"{REFUSED}s",
    )
    assert "session timeout" in _one_line_error(done)

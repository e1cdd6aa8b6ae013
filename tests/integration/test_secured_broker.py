"""`stepledger broker --engine kafka --secure`: SASL/SCRAM clients, ACLs enforced, a super user."""

from __future__ import annotations

import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from stepledger.config import load_settings
from stepledger.kafka import ensure_topics, listed_topics
from stepledger_dev.apache_kafka import KafkaBroker, Security

pytestmark = pytest.mark.kafka_only
CLI = [sys.executable, "-m", "stepledger"]


def _lines_until(proc: subprocess.Popen[str], pattern: str, timeout: float) -> list[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


def _anonymous_refused(bootstrap: str) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap, "log_level": "0"})
    with pytest.raises(KafkaException):
        client.list_topics(timeout=2)


def test_the_secure_broker_writes_its_super_users_config_and_refuses_anyone_else(
    src_env: dict[str, str], tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [*CLI, "broker", "--engine", "kafka", "--secure", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=src_env,
        cwd=tmp_path,
    )
    try:
        lines = _lines_until(proc, r"^export STEPLEDGER_CONFIG=", timeout=60)
        path = Path(lines[-1].strip().split("=", 1)[1])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        text = path.read_text()
        password = re.search(r'"sasl.password" = "([^"]+)"', text)
        assert password is not None
        assert not any(password.group(1) in line for line in lines), "printed a password"
        admin = load_settings(config_file=path, env={})
        assert admin.kafka["sasl.mechanism"] == "SCRAM-SHA-512"
        assert admin.topic in listed_topics(admin), "the super user lists the step log"
        _anonymous_refused(admin.bootstrap)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert not path.exists(), "the super user's config outlived its broker"


def test_a_secured_cluster_of_three_nodes_serves_the_super_user() -> None:
    with KafkaBroker(nodes=3, security=Security()) as kafka:
        settings = load_settings(
            {"bootstrap": kafka.bootstrap, "kafka": kafka.client_settings}, env={}
        )
        ensure_topics(settings, ["three-nodes"], partitions=1)
        assert "three-nodes" in listed_topics(settings)
        _anonymous_refused(kafka.bootstrap)

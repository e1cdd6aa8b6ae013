"""The compose file's lake profile, run here as processes: its catalog script and projector.

No Docker engine runs in CI (see test_compose_services.py), so the profile's PostgreSQL
init script runs against the test's PostgreSQL, and the ``projector-lake`` service's own
command and environment run as a process, the containers' names mapped to this machine's
loopback servers: it starts healthy, projects into the catalog the script made, and the
script's SELECT-only analyst role reads what it wrote.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepledger.config import Settings
from stepledger.readers.lake import LakeConfig, LakeSource
from stepledger.readers.query import run_query
from stepledger_dev.lake_stack import LakeStack
from stepledger_dev.postgres import free_port
from tests.integration.projector_helpers import produce_events, wait_for
from tests.lake.conftest import lake_offsets
from tests.unit.projector_logs import random_log

ROOT = Path(__file__).resolve().parents[2]


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_the_lake_profile_projects_and_its_analyst_role_reads(
    settings: Settings,
    stack: LakeStack,
    monkeypatch: pytest.MonkeyPatch,
    src_env: dict[str, str],
    tmp_path: Path,
) -> None:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "minio", "lake-init", "projector-lake"} <= set(services)
    assert all("healthcheck" in services[name] for name in ("postgres", "minio"))
    for name in ("STEPLEDGER_LAKE_PROJECTOR_PASSWORD", "STEPLEDGER_LAKE_ANALYST_PASSWORD"):
        monkeypatch.setenv(name, "test-password")
    for name, value in stack.env().items():
        monkeypatch.setenv(name, value)
    stack.postgres.sql_file("postgres", ROOT / "deploy/lake/postgres-init.sql")
    stack.s3.create_bucket("stepledger-lake")

    spec = services["projector-lake"]
    port = free_port()
    args = [str(a) for a in spec["command"][1:]]
    args[args.index("--metrics-port") + 1] = str(port)
    where = f"host=127.0.0.1 port={stack.postgres.port} "
    args = [a.replace("host=postgres ", where) for a in args]
    args += ["--topic", settings.topic, "--bootstrap", settings.bootstrap]
    args += ["--dlq-topic", settings.dlq_topic]
    env = {**src_env, **stack.env(), "STEPLEDGER_METRICS_HOST": "127.0.0.1"}
    with open(tmp_path / "projector.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stepledger", *args], env=env, stdout=log, stderr=log
        )
    try:
        wait_for(lambda: proc.poll() is not None or _answers(port), 120, "/readyz")
        assert proc.poll() is None, (tmp_path / "projector.log").read_text()[-2000:]
        sent = produce_events(settings, random_log(61, 10))
        analyst = LakeConfig.from_env(where + "dbname=stepledger_lake user=analyst")
        wait_for(lambda: sum(lake_offsets(analyst, settings.topic).values()) == sent, 120,
                 "the lake profile's projector to commit the log")  # fmt: skip
        [result] = run_query(LakeSource(analyst, settings.topic), "SELECT count(*) FROM workflows")
        assert result.rows == [(10,)]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

"""A projection per fleet: each fleet's projector, with its own credentials, writes its own
DuckDB directory, which holds that fleet's rows and no other's; a rebuild works the same way,
and the fleet's inbox serves and answers that projection's cases under its own role.

What docs/analysts.md ("Fleets: one projection each") promises, on a secured Apache Kafka
with fleets ``pa`` and ``pb`` made by ``fleet create`` and the exact commands it shows.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

import stepledger as sl
from stepledger.config import config_text, load_settings, write_private
from stepledger.domain import events as ev
from stepledger.history.kafka import KafkaHistory
from stepledger.inbox.auth import hash_token
from stepledger.inbox.roles import Grant
from stepledger.inbox.users import user_line
from stepledger.kafka.provision import create_fleet
from stepledger_dev.apache_kafka import KafkaBroker
from tests.e2e.recovery_helpers import append_events
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import snapshot_count, wait_for
from tests.integration.test_inbox import form
from tests.integration.test_inbox_fleets import _request
from tests.integration.test_inbox_identity import _serve

pytestmark = pytest.mark.kafka_only
CLI = [sys.executable, "-m", "stepledger"]
ANA = "ana-of-fleet-pa-0123456789"


@sl.tool(keyed=True, policy="redrive", timeout_s=5)
def count(n: int, *, idempotency_key: str) -> int:
    return n + 1


def _projected(db: Path, workflows: int) -> bool:
    return snapshot_count(db, "workflows") >= workflows


def _query(db: Path, sql: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [*CLI, "query", "--db", str(db), "--format", "csv", sql],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_fleets_projector_writes_only_its_fleets_rows_into_its_own_directory(
    secure_kafka: KafkaBroker, tmp_path: Path, src_env: dict[str, str]
) -> None:
    configs = tmp_path / "configs"
    admin_file = write_private(
        tmp_path / "admin.toml",
        config_text({"bootstrap": secure_kafka.bootstrap}, secure_kafka.client_settings),
    )
    admin = load_settings(config_file=admin_file, env={})
    env = {k: v for k, v in src_env.items() if not k.startswith("STEPLEDGER_")}
    for fleet, workflows in (("pa", 3), ("pb", 2)):
        create_fleet(admin, fleet, configs, partitions=2)
        agent = load_settings(config_file=configs / f"{fleet}-agent.toml", env={})
        with sl.Ledger(agent, tools=[count]) as ledger:
            for i in range(workflows - 1):
                ledger.workflow(f"{fleet}-w{i}", name="demo").step("count", count, n=i)
        # And one escalated wire each, for the fleet's inbox to answer.
        append_events(agent, h.escalated_wire(h.factory(fleet), f"{fleet}-wire", f"esc-{fleet}"))
    procs = {}
    for fleet in ("pa", "pb"):
        home = tmp_path / fleet
        home.mkdir(mode=0o750)
        procs[fleet] = subprocess.Popen(
            [*CLI, "project", "--config", str(configs / f"{fleet}-projector.toml"),
             "--db", str(home / "ledger.duckdb"), "--snapshot-interval", "0.3",
             "--session-timeout", "2"],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"{fleet}.log", "w"),  # noqa: SIM115 - the child keeps it
        )  # fmt: skip
    try:
        for fleet, workflows in (("pa", 3), ("pb", 2)):
            db = tmp_path / fleet / "ledger.duckdb"
            wait_for(
                functools.partial(_projected, db, workflows),
                90,
                f"{fleet}'s projection ({(tmp_path / f'{fleet}.log').read_text()[-400:]})",
            )
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(30)
    for fleet, workflows in (("pa", 3), ("pb", 2)):
        db = tmp_path / fleet / "ledger.duckdb"
        assert "not authorised" not in (tmp_path / f"{fleet}.log").read_text()
        seen = _query(db, "SELECT fleet_id, count(*) AS n FROM workflows GROUP BY ALL", env)
        assert seen.split() == ["fleet_id,n", f"{fleet},{workflows}"]
        topics = _query(db, "SELECT DISTINCT topic FROM offsets", env)
        assert topics.split() == ["topic", fleet]
    # A rebuild from offset 0 with the same credentials yields the same rows.
    rebuilt = tmp_path / "pa-rebuilt" / "ledger.duckdb"
    rebuilt.parent.mkdir(mode=0o750)
    done = subprocess.run(
        [*CLI, "rebuild", "--config", str(configs / "pa-projector.toml"), "--db", str(rebuilt)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    assert "not authorised" not in done.stderr
    table = "SELECT workflow_id, status FROM workflows ORDER BY ALL"
    assert _query(rebuilt, table, env) == _query(tmp_path / "pa" / "ledger.duckdb", table, env)
    # The fleet's inbox serves its projection with the inbox role's credentials.
    users = tmp_path / "users"
    users.write_text(user_line("ana", hash_token(ANA), Grant(frozenset({"pa"}))) + "\n")
    argv = [
        "--config",
        str(configs / "pa-inbox.toml"),
        "--db",
        str(tmp_path / "pa" / "ledger.duckdb"),
    ]
    inbox, url = _serve([*argv, "--users", str(users)], env)
    base = url.split("/?")[0]
    try:
        status, queue = _request(base + "/", ANA)
        assert status == 200 and 'data-case="esc-pa"' in queue
        status, page = _request(base + "/escalations/esc-pa", ANA)
        assert status == 200, page
        answer = form(page, answer="not_happened", note="no wire at the bank")
        status, answered = _request(base + "/escalations/esc-pa", ANA, answer)
        assert status == 303, answered
    finally:
        inbox.terminate()
        output = inbox.communicate(timeout=30)[0]
    assert "not authorised" not in output, output
    agent = load_settings(config_file=configs / "pa-agent.toml", env={})
    events = KafkaHistory(agent).read("pa-wire").events
    (resolved,) = [e.body for e in events if isinstance(e.body, ev.EscalationResolved)]
    assert (resolved.by, resolved.auth) == ("ana", "users_file")
    assert {e.fleet_id for e in events} == {"pa"}

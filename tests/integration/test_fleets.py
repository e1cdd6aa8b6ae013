"""Two fleets on one secured Apache Kafka: each role works with its own ACLs only, and a
client holding fleet B's credentials can neither write, read nor create anything of A's.

One secured broker for the module (``secure_kafka``); each refusal must come back as one
line naming the role, the ACL and the resource, and leave fleet A's topics as they were.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

import stepledger as sl
from stepledger.config import Settings, config_text, load_settings, write_private
from stepledger.errors import NotAuthorisedError, RecordRefusedError
from stepledger.fleets import fleet_names, role_permissions
from stepledger.kafka import DurableProducer, ensure_topics, topic_partitions
from stepledger.kafka.provision import create_fleet, fleet_acls
from stepledger.kafka.security import delete_acls
from stepledger_dev.apache_kafka import KafkaBroker

pytestmark = pytest.mark.kafka_only
CLI = [sys.executable, "-m", "stepledger"]


@pytest.fixture(scope="module")
def fleets(secure_kafka: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fleets ``fa`` and ``fb`` created on the module's broker; their configs' directory."""
    out = tmp_path_factory.mktemp("fleets")
    admin_file = write_private(
        out / "admin.toml",
        config_text({"bootstrap": secure_kafka.bootstrap}, secure_kafka.client_settings),
    )
    admin = load_settings(config_file=admin_file, env={})
    for name in ("fa", "fb"):
        create_fleet(admin, name, out, partitions=2)
    return out


def _role(fleets: Path, fleet: str, role: str) -> Settings:
    return load_settings(config_file=fleets / f"{fleet}-{role}.toml", env={})


def _ends(admin: Settings, topics: list[str]) -> dict[tuple[str, int], int]:
    client = Consumer({**admin.client_config(), "group.id": "witness", "log_level": "0"})
    try:
        return {
            (t, p): client.get_watermark_offsets(TopicPartition(t, p), timeout=5)[1]
            for t in topics
            for p in topic_partitions(admin, t)
        }
    finally:
        client.close()


@sl.tool(keyed=True, policy="redrive", timeout_s=5)
def add(n: int, *, idempotency_key: str) -> int:
    return n + 1


def test_each_role_of_a_fleet_does_its_job_with_its_own_credentials(
    fleets: Path, src_env: dict[str, str], tmp_path: Path
) -> None:
    agent = _role(fleets, "fa", "agent")
    with sl.Ledger(agent, tools=[add]) as ledger:
        results = [ledger.workflow(f"w{i}", name="demo").step("add", add, n=i) for i in range(3)]
    assert results == [1, 2, 3]
    daemons = {
        "projector": ["project", "--db", str(tmp_path / "fa.duckdb"), "--session-timeout", "2"],
        "recovery": ["recover", "--tools", "none", "--state-in-kafka"],
        "checkpointer": ["checkpoint"],
    }
    ports = {role: _free_port() for role in daemons}
    procs = [
        subprocess.Popen(
            [*CLI, *args, "--config", str(fleets / f"fa-{role}.toml"),
             "--metrics-port", str(ports[role])],
            env=src_env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{role}.log", "w"),  # noqa: SIM115 - the child keeps it
        )
        for role, args in daemons.items()
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        waiting = set(daemons)
        while waiting and time.monotonic() < deadline:
            waiting = {role for role in waiting if not _ready(ports[role])}
            time.sleep(0.2)
        logs = {r: (tmp_path / f"{r}.log").read_text()[-600:] for r in waiting}
        assert not waiting, f"not ready: {logs}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    for role in daemons:
        assert "not authorised" not in (tmp_path / f"{role}.log").read_text(), role


def test_fleet_bs_agent_can_neither_write_read_nor_create_anything_of_fleet_a(
    fleets: Path, secure_kafka: KafkaBroker
) -> None:
    admin = load_settings(
        {"bootstrap": secure_kafka.bootstrap, "kafka": secure_kafka.client_settings}, env={}
    )
    a_topics = ["fa", "fa.checkpoints", "fa.recovery-state", "fa.deadletters"]
    before = _ends(admin, a_topics)
    # A hostile client builds its settings itself: the pinned config file is no barrier.
    hostile = _role(fleets, "fb", "agent")
    producer = DurableProducer(hostile)
    for topic in ("fa", "fa.checkpoints"):
        with pytest.raises(RecordRefusedError) as refused:
            producer.append(topic, b"w1", b"forged")
        assert refused.value.message == (
            f"not authorised: fb agent (User:fb.agent) lacks WRITE on TOPIC {topic}"
        )
    producer.close()
    with pytest.raises(
        NotAuthorisedError, match=r"^not authorised: fb agent .* lacks DESCRIBE on TOPIC fa "
    ):
        topic_partitions(hostile, "fa")
    with pytest.raises(
        NotAuthorisedError, match=r"^not authorised: fb agent .* lacks CREATE on TOPIC fa.extra"
    ):
        ensure_topics(hostile, ["fa.extra"])
    reader = Consumer({**hostile.client_config(), "group.id": "fb.reader", "log_level": "0",
                       "enable.auto.commit": False})  # fmt: skip
    try:
        reader.assign([TopicPartition("fa", 0, 0), TopicPartition("fa", 1, 0)])
        polled = [m for m in reader.consume(10, 2.0) if m.error() is None]
        assert polled == [], "fleet B read fleet A's steps"
    finally:
        reader.close()
    assert _ends(admin, a_topics) == before
    listed = AdminClient(admin.client_config()).list_topics(timeout=5).topics
    assert "fa.extra" not in listed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def test_an_agent_reserves_on_its_fleets_budget_topic_and_another_fleets_cannot(
    fleets: Path,
) -> None:
    from stepledger.domain.usage import TurnUsage
    from stepledger.integrations import FleetBudget, Spending
    from stepledger.integrations._core import agent_steps

    spending = Spending(fleet_budget=FleetBudget(tokens=1_000, per_turn_tokens=300))
    answer = ({"text": "hi"}, TurnUsage(input_tokens=120))
    with sl.Ledger(_role(fleets, "fa", "agent")) as ledger:
        steps = agent_steps(ledger.workflow("budgeted"), spending=spending)
        assert not steps.model_turn_sync({"q": 1}, lambda: answer).reused
        steps.model_turn_sync({"q": 2}, lambda: answer)
        # The first turn settled at 120 (read back by the second), the second reserved 300.
        assert ledger.fleet_budgets.spend.tokens == 120 + 300
    hostile = _role(fleets, "fb", "agent").model_copy(update={"budget_topic": "fa.budget"})
    with sl.Ledger(hostile) as ledger:
        steps = agent_steps(ledger.workflow("stolen"), spending=spending)
        with pytest.raises((NotAuthorisedError, RecordRefusedError), match=r"fa\.budget"):
            steps.model_turn_sync({"q": 1}, pytest.fail)


def test_an_upgrade_adds_the_acls_a_release_needs_and_keeps_every_password(
    secure_kafka: KafkaBroker, fleets: Path, src_env: dict[str, str]
) -> None:
    admin_file = fleets / "admin.toml"
    admin = load_settings(config_file=admin_file, env={})
    create_fleet(admin, "fc", fleets, partitions=2)
    # A fleet made by an older release: its agent lacks the budget topic's ACLs.
    budget = [p for p in role_permissions("fc", "agent") if p.name == fleet_names("fc").budget]
    assert budget
    delete_acls(admin, budget)
    assert not set(budget) & set(fleet_acls(admin, "fc")["agent"])
    before = (fleets / "fc-agent.toml").read_bytes()
    done = subprocess.run(
        [*CLI, "fleet", "upgrade", "fc", "--config", str(admin_file)],
        capture_output=True, text=True, env=src_env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()[:-1]) == sorted(f"added: {p.describe()}" for p in budget)
    assert set(budget) <= set(fleet_acls(admin, "fc")["agent"])
    # The config written before the upgrade still works: no password changed.
    assert (fleets / "fc-agent.toml").read_bytes() == before
    with sl.Ledger(_role(fleets, "fc", "agent"), tools=[add]) as ledger:
        assert ledger.workflow("upgraded", name="demo").step("add", add, n=1) == 2
    again = subprocess.run(
        [*CLI, "fleet", "upgrade", "fc", "--config", str(admin_file)],
        capture_output=True, text=True, env=src_env, timeout=60, check=False,
    )  # fmt: skip
    assert again.stdout.strip().endswith("0 ACL(s) added; topics as this release needs them")
    missing = subprocess.run(
        [*CLI, "fleet", "upgrade", "nosuch", "--config", str(admin_file)],
        capture_output=True, text=True, env=src_env, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode != 0 and "no fleet 'nosuch'" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

"""What one fleet on a secured Apache Kafka cannot do to another beyond the ACLs: flood it
(quotas), slip records into its log (a foreign fleet id is dead-lettered), and what the
admin paths and the doctor say when credentials are wrong or too wide.

One secured broker for the module (``secure_kafka``); fleets ``qa`` and ``qb`` on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import pytest
from confluent_kafka import Producer

import stepledger as sl
from stepledger.codec import Codec
from stepledger.config import Settings, config_text, load_settings, write_private
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.errors import NotAuthorisedError
from stepledger.fleets import ROLES, Permission
from stepledger.fleets.quotas import Quota
from stepledger.kafka import listed_topics
from stepledger.kafka.provision import create_fleet, fleet_quotas
from stepledger.kafka.quotas import alter_user_quotas
from stepledger.kafka.reader import Record, read_topic
from stepledger.kafka.security import create_acls, delete_acls
from stepledger_dev.apache_kafka import KafkaBroker
from tests.e2e.recovery_helpers import append_events

pytestmark = pytest.mark.kafka_only
CLI = [sys.executable, "-m", "stepledger"]
ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
#: Fleet qa's produce quota (bytes/s per broker): far below what one client can write.
FLOOD_QUOTA = 200_000


@pytest.fixture(scope="module")
def fleets(secure_kafka: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fleets ``qa`` (a low produce quota) and ``qb`` (the defaults); the configs' directory,
    with the super user's as ``admin.toml``."""
    out = tmp_path_factory.mktemp("fleets")
    admin_file = write_private(
        out / "admin.toml",
        config_text({"bootstrap": secure_kafka.bootstrap}, secure_kafka.client_settings),
    )
    admin = load_settings(config_file=admin_file, env={})
    create_fleet(admin, "qa", out, partitions=2, quota=Quota(producer_byte_rate=FLOOD_QUOTA))
    create_fleet(admin, "qb", out, partitions=2)
    return out


def _settings(fleets: Path, name: str) -> Settings:
    return load_settings(config_file=fleets / f"{name}.toml", env={})


def _cli(fleets: Path, *args: str, config: str = "admin") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--config", str(fleets / f"{config}.toml")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_fleet_create_sets_the_quota_and_fleet_quota_changes_only_the_rates_given(
    fleets: Path,
) -> None:
    admin = _settings(fleets, "admin")
    held = fleet_quotas(admin, "qa")
    assert set(held) == {f"qa.{role}" for role in ROLES}
    assert all(r == {"producer_byte_rate": FLOOD_QUOTA, "consumer_byte_rate": 50 * 2**20}
               for r in held.values()), held  # fmt: skip
    changed = _cli(fleets, "fleet", "quota", "qb", "--request-percentage", "80",
                   "--fetch-bytes-per-s", "none")  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert "User:qb.agent: producer_byte_rate=10485760, request_percentage=80" in changed.stdout
    shown = _cli(fleets, "fleet", "show", "qb")
    assert "quota User:qb.inbox: producer_byte_rate=10485760, request_percentage=80" in shown.stdout
    back = _cli(fleets, "fleet", "quota", "qb", "--request-percentage", "none",
                "--fetch-bytes-per-s", str(50 * 2**20))  # fmt: skip
    assert back.returncode == 0, back.stderr
    assert fleet_quotas(admin, "qb")["qb.agent"] == {
        "producer_byte_rate": 10 * 2**20, "consumer_byte_rate": 50 * 2**20}  # fmt: skip


def test_a_fleets_own_credentials_cannot_raise_its_quota(fleets: Path) -> None:
    agent = _settings(fleets, "qa-agent")
    with pytest.raises(NotAuthorisedError) as refused:
        alter_user_quotas(agent, {"qa.agent": Quota(producer_byte_rate=10**9)})
    assert refused.value.message == (
        "not authorised: qa agent (User:qa.agent) lacks ALTER_CONFIGS on CLUSTER "
        "(to alter client quotas)"
    )
    assert fleet_quotas(_settings(fleets, "admin"), "qa")["qa.agent"]["producer_byte_rate"] == (
        FLOOD_QUOTA
    )


def test_a_flooding_fleet_is_throttled_to_its_quota_and_another_fleets_produce_is_not(
    fleets: Path,
) -> None:
    flooder = subprocess.Popen(
        [sys.executable, "-m", "bench.flooder", str(fleets / "qa-agent.toml"), "6"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        neighbour = _produce_steadily(_settings(fleets, "qb-agent"), records=600, seconds=3.0)
        out, _ = flooder.communicate(timeout=60)
    finally:
        flooder.kill()
    flood = json.loads(out)
    # The broker answers a client over its rate late by the time that brings it back to the
    # quota: the flooder is told so, fleet qb's client (at ~200 KB/s of its 10 MiB/s) never.
    assert flood["max_throttle_s"] > 1.0, flood
    assert neighbour["max_throttle_s"] == 0.0, neighbour
    assert neighbour["acked_bytes"] == 600 * 1000, neighbour
    # What one client could write unthrottled is ~100x the quota; held to the quota it wrote a
    # burst (the requests in flight when throttling began) and then ~the quota.
    assert flood["acked_bytes"] / flood["seconds"] < 40 * FLOOD_QUOTA, flood


def _produce_steadily(settings: Settings, records: int, seconds: float) -> dict[str, float]:
    """Produce ``records`` 1 KB records spread over ``seconds``; what was acked, throttled."""
    acked, throttled = [0], [0.0]

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked[0] += len(msg.value())  # type: ignore[attr-defined]

    def throttle(event: object) -> None:
        throttled[0] = max(throttled[0], float(event.throttle_time))  # type: ignore[attr-defined]

    producer = Producer(settings.client_config(
        **{"acks": "all", "throttle_cb": throttle, "log_level": 0}))  # fmt: skip
    started = time.monotonic()
    for n in range(records):
        producer.produce(settings.topic, b"y" * 1000, str(n).encode(), on_delivery=delivered)
        producer.poll(0)
        time.sleep(max(0.0, started + seconds * (n + 1) / records - time.monotonic()))
    producer.flush(30)
    return {"acked_bytes": acked[0], "max_throttle_s": throttled[0]}


#: Every administrator's command that asks the broker (``fleet acls`` asks nothing).
ADMIN_COMMANDS = [
    ("fleet", "create", "qz", "--out", "{out}"),
    ("fleet", "list"),
    ("fleet", "show", "qa"),
    ("fleet", "quota", "qa", "--produce-bytes-per-s", "1000"),
    ("fleet", "delete", "qz"),
    ("init",),
    ("doctor",),
]


def test_a_wrong_admin_password_is_one_line_naming_the_principal(
    fleets: Path, tmp_path: Path
) -> None:
    admin = _settings(fleets, "admin")
    wrong = {**admin.kafka, "sasl.password": "not-the-password"}
    text = config_text({"bootstrap": admin.bootstrap}, wrong)
    config = write_private(tmp_path / "wrong.toml", text)
    running = {
        args[:2]: subprocess.Popen(
            [*CLI, *(a.format(out=tmp_path) for a in args), "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for args in ADMIN_COMMANDS
    }  # fmt: skip
    said = {name: proc.communicate(timeout=120)[1] for name, proc in running.items()}
    line = (
        "Error: not authorised: User:admin was refused its login (wrong password or unknown user)"
    )
    codes = {name: proc.returncode for name, proc in running.items()}
    assert codes == dict.fromkeys(running, 1), said
    assert {name: err.strip().splitlines() for name, err in said.items()} == {
        name: [line] for name in running
    }
    assert fleet_quotas(admin, "qa")["qa.agent"]["producer_byte_rate"] == FLOOD_QUOTA
    assert not (tmp_path / "qz-agent.toml").exists()


def test_a_library_call_with_a_wrong_password_says_the_login_was_refused(fleets: Path) -> None:
    admin = _settings(fleets, "admin")
    wrong = admin.model_copy(update={"kafka": {**admin.kafka, "sasl.password": "nope"}})
    # librdkafka lets the request run into its timeout ("transport failure"): the line must
    # still say what happened, not that the broker cannot be reached.
    with pytest.raises(NotAuthorisedError, match=r"^not authorised: User:admin was refused"):
        listed_topics(wrong, timeout=2)


def test_a_record_claiming_another_fleet_is_dead_lettered_by_the_fleets_daemons_never_applied(
    fleets: Path, tmp_path: Path
) -> None:
    """A misconfigured client with fleet qb's agent credentials writes fleet qa's id into
    qb's step log: qb's projector dead-letters each such record (stage ``fleet``), qb's
    recovery daemon decides nothing on them, while qb's own in-doubt step is escalated."""
    agent = _settings(fleets, "qb-agent")
    run = uuid.uuid4().hex[:6]
    own, foreign = f"own-{run}", f"foreign-{run}"
    events = [
        EventFactory("qb", "agent").intent(own, "s", QUICK, {"n": 1}, sequence=0),
        EventFactory("qa", "misconfigured").intent(foreign, "s", QUICK, {"n": 1}, sequence=0),
        EventFactory("qa", "misconfigured").outcome(foreign, "s", attempt=1,
                                                    status=OutcomeStatus.SUCCEEDED),
    ]  # fmt: skip
    append_events(agent, events)
    db = tmp_path / "qb.duckdb"
    daemons = {
        "projector": ["project", "--db", str(db), "--session-timeout", "2"],
        "recovery": ["recover", "--tools", "none", "--state-in-kafka", "--grace", "0s"],
    }
    procs = {
        role: subprocess.Popen(
            [*CLI, *args, "--config", str(fleets / f"qb-{role}.toml")], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{role}.log", "w"),  # noqa: SIM115 - the child keeps it
        )
        for role, args in daemons.items()
    }  # fmt: skip
    admin = _settings(fleets, "admin")
    try:
        # Only the letters of this test: the flood test wrote raw records into qb's log too.
        letters = _wait_for(lambda: _letters(admin, foreign, 2), 60, "dead letters")
        decided = _wait_for(lambda: _decisions(admin, own, "agent"), 60, "a decision on qb's")
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(30)
    assert [(r.key, _header(r, "dlq_stage")) for r in letters] == [(foreign.encode(), "fleet")] * 2
    assert "claims fleet 'qa' in the step log of fleet 'qb'" in _header(letters[0], "dlq_error")
    assert decided
    # Nothing was decided for the foreign workflow, and the projection has none of it.
    assert not _decisions(admin, foreign, "misconfigured")
    with duckdb.connect(str(db), read_only=True) as con:
        projected = {row[0] for row in con.execute("SELECT workflow_id FROM workflows").fetchall()}
    assert own in projected and foreign not in projected
    assert "not authorised" not in (tmp_path / "recovery.log").read_text()


@sl.tool(keyed=True, policy="redrive", timeout_s=1)
def quick(n: int, *, idempotency_key: str) -> int:
    return n


QUICK = quick


def _wait_for(probe: Callable[[], T], seconds: float, what: str) -> T:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.3)
    raise AssertionError(f"no {what} within {seconds}s")


def _letters(admin: Settings, key: str, count: int) -> list[Record]:
    """Fleet qb's dead letters of records keyed ``key``, once there are ``count``."""
    read = read_topic(admin, Codec(), topic="qb.deadletters", idle_timeout=0.3, max_time=5)
    found = [r for r in read if r.key == key.encode()]
    return found if len(found) >= count else []


def _decisions(admin: Settings, workflow: str, writer: str) -> list[str]:
    """The types of the events of ``workflow`` that another than ``writer`` appended."""
    return [
        r.event.type
        for r in read_topic(admin, Codec(), topic="qb", idle_timeout=0.3, max_time=5)
        if r.event is not None and r.event.workflow_id == workflow and r.event.producer_id != writer
    ]


def _header(record: Record, name: str) -> str:
    return (dict(record.headers).get(name) or b"").decode()


def test_doctor_checks_each_role_with_its_own_credentials_and_finds_wide_acls(
    fleets: Path,
) -> None:
    admin = _settings(fleets, "admin")
    for role in ("agent", "projector"):
        done = _cli(fleets, "doctor", config=f"qa-{role}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"OK     access      qa {role}: holds what its table says on qa" in done.stdout
        assert (f"OK     access      qa {role}: can touch no other fleet's topic nor alter "
                "ACLs or quotas") in done.stdout  # fmt: skip
    assert "OK     acls        cluster: no ACL lets any principal write" in _cli(
        fleets, "doctor").stdout  # fmt: skip
    widened = [
        Permission("User:qa.agent", "TOPIC", "qb", "LITERAL", "WRITE"),
        Permission("User:*", "TOPIC", "qb", "PREFIXED", "WRITE"),
    ]
    taken = Permission("User:qa.projector", "TOPIC", "qa", "LITERAL", "READ")
    create_acls(admin, widened)
    delete_acls(admin, [taken])
    try:
        agent = _cli(fleets, "doctor", config="qa-agent")
        projector = _cli(fleets, "doctor", config="qa-projector")
        wide = _cli(fleets, "doctor")
    finally:
        delete_acls(admin, widened)
        create_acls(admin, [taken])
    assert agent.returncode == 1
    assert ("UNSAFE access      qa agent: may WRITE TOPIC qb of another fleet: a fleet role "
            "must not") in agent.stdout  # fmt: skip
    assert "OK     access      qa agent: holds what its table says" in agent.stdout
    assert projector.returncode == 1
    assert ("UNSAFE access      qa projector: lacks READ on TOPIC qa: it cannot do its job"
            in projector.stdout)  # fmt: skip
    assert wide.returncode == 1
    assert ("UNSAFE acls        fleet qb: any principal may write qb, qb.budget, "
            "qb.checkpoints, qb.deadletters, qb.recovery-state (ACL User:* WRITE TOPIC qb "
            "(prefix))"
            in wide.stdout)  # fmt: skip
    assert "fleet qa" not in wide.stdout

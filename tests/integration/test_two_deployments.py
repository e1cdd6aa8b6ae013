"""Two step logs on one cluster never share state (invariant 21; issue 42, defect 1).

Up to 0.3.0 every step log of a cluster had one checkpoint topic by default, and readers
took any record in it: a second log's checkpointer started from the first one's progress
and never checkpointed its own early workflows, so once retention deleted that log's head
a waiting workflow opened as new and sent its email again, and its projector restored
the first log's workflows into its tables.  Here on Apache Kafka (Tansu deletes nothing):
the head is deleted with DeleteRecords, as segment expiry deletes it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from stepledger.checkpoints.record import WorkflowCheckpoint, encode
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.errors import HistoryExpiredError
from stepledger.kafka import DurableProducer, Headers, admin
from stepledger.kafka.logid import LogIdentity, resolve
from stepledger.producer import Ledger
from tests.conftest import unique
from tests.integration.projector_helpers import projecting, query_one, wait_for
from tests.integration.test_retention import CLI, delete_head, run_paid, sender, watermarks

pytestmark = pytest.mark.kafka_only
EMAIL = Tool(name="email", effect="irreversible")
TOOLS = "stepledger_dev.examples.tools:registry"
#: The roles a step log's state topics are named for (``TOPIC.<role>``).
RULES = ("deadletters", "checkpoints", "recovery-state")


def stepledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=90)


def deployment(
    bootstrap: str, src_env: dict[str, str], *, checkpoint_topic: str | None = None
) -> tuple[Settings, dict[str, str]]:
    """A step log made by ``stepledger init --checkpoints`` on one partition, named by its
    topic alone (every other name its default) unless a checkpoint topic is given."""
    topic = unique("events")
    env = {**src_env, "STEPLEDGER_BOOTSTRAP": bootstrap, "STEPLEDGER_TOPIC": topic}
    if checkpoint_topic is not None:
        env["STEPLEDGER_CHECKPOINT_TOPIC"] = checkpoint_topic
    made = stepledger(env, "init", "--partitions", "1", "--checkpoints")
    assert made.returncode == 0, made.stderr
    settings = Settings(bootstrap=bootstrap, topic=topic)
    if checkpoint_topic is not None:
        settings = Settings(bootstrap=bootstrap, topic=topic, checkpoint_topic=checkpoint_topic)
    return settings, env


def email_then_wait(settings: Settings, workflow_id: str, send: Callable[..., str]) -> None:
    """The workflow sends its email and waits (for a person, a timer: it does not finish)."""
    with Ledger(settings) as ledger:
        ledger.workflow(workflow_id).step("email", EMAIL, {"to": "ann"}, send)


def test_two_step_logs_on_defaults_get_their_own_state_topics_and_groups(
    bootstrap: str, src_env: dict[str, str], tmp_path: Path
) -> None:
    logs = [deployment(bootstrap, src_env) for _ in range(2)]
    daemons = []
    try:
        for number, (_, env) in enumerate(logs):
            tools = {"STEPLEDGER_EMAIL_URL": "http://127.0.0.1:9"}  # never called here
            where = ["--state-dir", str(tmp_path / str(number))]
            argv = [*CLI, "recover", "--tools", TOOLS, *where, "--max-seconds", "60"]
            daemons.append(subprocess.Popen(argv, env={**env, **tools}, stderr=subprocess.PIPE))
        (a, _), (b, _) = logs

        def joined() -> dict[str, set[str]]:
            """Each running recovery group, with the topics its members were given."""
            client = admin(a)
            ids = [a.recovery_group, b.recovery_group]
            found = {}
            for group_id, future in client.describe_consumer_groups(ids).items():
                try:
                    members = future.result(timeout=10).members
                except KafkaException:
                    return {}  # the coordinator is still being found: asked again
                topics = {tp.topic for m in members for tp in m.assignment.topic_partitions}
                if topics:
                    found[group_id] = topics
            return found if len(found) == 2 else {}

        groups = wait_for(joined, 90, "both recovery daemons to join their groups")
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.communicate(timeout=30)
    assert groups == {f"{a.topic}.recovery": {a.topic}, f"{b.topic}.recovery": {b.topic}}
    listed = set(admin(a).list_topics(timeout=10).topics)
    names = [(s.dlq_topic, s.checkpoint_topic, s.recovery_state_topic) for s, _ in logs]
    for (settings, _), own in zip(logs, names, strict=True):
        assert own == tuple(f"{settings.topic}.{r}" for r in RULES) and set(own) <= listed
    assert set(names[0]).isdisjoint(names[1])


def test_a_shared_checkpoint_topic_never_opens_a_waiting_workflow_as_new(
    bootstrap: str, src_env: dict[str, str]
) -> None:
    """The email-twice story, with the checkpoint topic both logs had by default."""
    shared = unique("checkpoints")
    a, a_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    b, b_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    run_paid(a, 40, "a")
    assert stepledger(a_env, "checkpoint", "--once").returncode == 0

    sent, send = sender()
    waiting = unique("waiting")
    email_then_wait(b, waiting, send)
    assert sent == ["ann"]
    run_paid(b, 60, "b")  # B's log grows past A's progress
    assert watermarks(b, 0)[1] > watermarks(a, 0)[1]
    checkpointed = stepledger(b_env, "checkpoint", "--once", "--log-level", "INFO")
    assert checkpointed.returncode == 0, checkpointed.stderr
    start = delete_head(b, 0)
    assert watermarks(b, 0) == (start, start)

    email_then_wait(b, waiting, send)  # resumed from its checkpoint: the email replays
    assert sent == ["ann"]
    assert "names another step log" in checkpointed.stderr  # A's records, refused
    with Ledger(b) as ledger:
        assert ledger.workflow(unique("fresh")).state.attempt == 1  # B's own progress


def test_a_projector_restores_only_its_own_logs_workflows_from_a_shared_topic(
    bootstrap: str, src_env: dict[str, str], tmp_path: Path
) -> None:
    shared = unique("checkpoints")
    a, a_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    b, b_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    run_paid(a, 30, "a")
    assert stepledger(a_env, "checkpoint", "--once").returncode == 0
    db = tmp_path / "b.duckdb"
    run_paid(b, 5, "b-early")
    _, early = watermarks(b, 0)
    with projecting(b, db) as projector:
        projector.wait_received(early)
    run_paid(b, 10, "b-down")  # B's projector is down
    assert stepledger(b_env, "checkpoint", "--once").returncode == 0
    _, high = watermarks(b, 0)
    assert delete_head(b, 0) == high
    with projecting(b, db) as projector:
        projector.wait_received(high - early)  # from the checkpoints: the head is gone
    assert query_one(db, "SELECT next_offset FROM offsets") == [(high,)]
    workflows = [row[0] for row in query_one(db, "SELECT workflow_id FROM workflows")]
    assert not [w for w in workflows if w.startswith("a-")]
    assert len(workflows) == 15 and query_one(db, "SELECT count(*) FROM gaps") == [(0,)]


def forged_progress(settings: Settings, covered: int, named: LogIdentity | None) -> None:
    """A progress record written by hand, naming ``named`` (None: no step log)."""
    record = WorkflowCheckpoint(None, settings.topic, 0, covered)
    headers: Headers = [] if named is None else [named.header]
    producer = DurableProducer(settings)
    try:
        future = producer.send(
            settings.checkpoint_topic, record.key, encode(record), headers, partition=0
        )
        producer.wait(future)
    finally:
        producer.close()


@pytest.mark.parametrize("forged", ["past the end", "unnamed", "another log"])
def test_a_forged_progress_record_does_not_make_an_id_new(
    bootstrap: str, src_env: dict[str, str], forged: str
) -> None:
    settings, _ = deployment(bootstrap, src_env)
    sent, send = sender()
    waiting = unique("waiting")
    email_then_wait(settings, waiting, send)  # no checkpointer has run: no checkpoint
    _, high = watermarks(settings, 0)
    own = resolve(settings)
    if forged == "past the end":  # it even names this log, as anyone may read its id
        forged_progress(settings, 10**9, own)
    elif forged == "unnamed":  # as a 0.3.0 checkpointer, or any client, writes it
        forged_progress(settings, high - 1, None)
    else:
        forged_progress(settings, high - 1, LogIdentity(settings.topic, "another-id"))
    delete_head(settings, 0)
    with pytest.raises(HistoryExpiredError):
        email_then_wait(settings, waiting, send)
    assert sent == ["ann"]


def test_doctor_reports_a_checkpoint_topic_shared_by_two_logs(
    bootstrap: str, src_env: dict[str, str]
) -> None:
    shared = unique("checkpoints")
    a, a_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    b, b_env = deployment(bootstrap, src_env, checkpoint_topic=shared)
    for settings, env in ((a, a_env), (b, b_env)):
        run_paid(settings, 3, unique("wf"))
        assert stepledger(env, "checkpoint", "--once").returncode == 0
    found = stepledger(a_env, "doctor")
    assert found.returncode == 1, found.stdout
    shared_lines = [line for line in found.stdout.splitlines() if " shared " in line]
    assert shared_lines and shared_lines[0].startswith("UNSAFE")
    assert str(resolve(b)) in shared_lines[0] and shared in shared_lines[0]
    alone, alone_env = deployment(bootstrap, src_env)
    run_paid(alone, 3, unique("wf"))
    assert stepledger(alone_env, "checkpoint", "--once").returncode == 0
    lines = stepledger(alone_env, "doctor").stdout.splitlines()
    shared_lines = [line for line in lines if " shared " in line]
    assert shared_lines and all(line.startswith("OK") for line in shared_lines), lines

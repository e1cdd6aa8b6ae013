"""A reader without a shared volume: its own projection, restored from the checkpoints.

An analyst's machine (or the inbox's) runs ``stepledger project --db local.duckdb --group
<its own>``: a new group has no position, so the partition starts at the log start; when
the head of the log already expired, what it lost comes back from the workflow checkpoints
(Apache Kafka: Tansu deletes nothing).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from stepledger.config import Settings
from tests.conftest import unique
from tests.integration.projector_helpers import STEPLEDGER, query_one, wait_for
from tests.integration.test_retention import (
    checkpointed_log,
    cli,
    delete_head,
    differing,
    kafka_only,
    run_paid,
    watermarks,
)


def reader_projector(
    settings: Settings, db: Path, group: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    """``stepledger project`` as a reader runs it: a local file, a group of its own."""
    argv = [
        *STEPLEDGER,
        "project",
        *("--bootstrap", settings.bootstrap, "--topic", settings.topic),
        *("--dlq-topic", settings.dlq_topic, "--db", str(db), "--group", group),
        *("--snapshot-interval", "0.2", "--log-level", "INFO"),
    ]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def snapshot_count(snapshot: Path, sql: str) -> int:
    if not snapshot.exists():
        return -1
    try:
        row = query_one(snapshot, sql)
    except Exception:  # being replaced: ask again
        return -1
    return int(row[0][0]) if row else -1


@kafka_only
def test_a_reader_projection_started_after_the_head_expired_equals_a_rebuild_before_it(
    make_settings: Callable[..., Settings], tmp_path: Path, src_env: dict[str, str]
) -> None:
    settings, env = checkpointed_log(make_settings, src_env)
    run_paid(settings, 30, "early")
    assert cli(settings, env, "checkpoint", "--once").returncode == 0
    before = tmp_path / "before.duckdb"
    assert cli(settings, env, "rebuild", "--db", str(before)).returncode == 0
    _, high = watermarks(settings, 0)
    assert delete_head(settings, 0) == high  # nothing of the log is left to replay

    db = tmp_path / "reader.duckdb"
    snapshot = tmp_path / "reader.snapshot.duckdb"
    reader = reader_projector(settings, db, unique("reader"), env)
    try:
        wait_for(
            lambda: snapshot_count(snapshot, "SELECT count(*) FROM workflows") == 30,
            60,
            "the reader's projection restored from the checkpoints",
        )
        run_paid(settings, 2, "after")  # and it follows the tail
        wait_for(
            lambda: snapshot_count(snapshot, "SELECT count(*) FROM workflows") == 32,
            60,
            "the reader's projection following the tail",
        )
    finally:
        reader.send_signal(signal.SIGTERM)
        _, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    assert f"records below the log start {high} from {settings.checkpoint_topic}" in err, err
    assert "records lost" not in err
    assert query_one(db, "SELECT count(*) FROM gaps") == [(0,)]
    assert query_one(db, "SELECT next_offset FROM offsets") == [(watermarks(settings, 0)[1],)]
    for table in ("workflows", "steps", "escalations", "events"):
        where = "WHERE workflow_id NOT LIKE 'after-%'"
        assert differing(db, before, table, where) == 0, table

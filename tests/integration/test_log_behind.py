"""Stored offsets ahead of the log (topic re-created, broker restarted empty) stop the projector."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.kafka import admin, ensure_topics
from tests.integration.projector_helpers import (
    produce_events,
    projecting,
    query_one,
    spawn_projector,
)
from tests.unit.projector_logs import random_log


def recreate(settings: Settings) -> None:
    """Delete the step-log topic and create it again, empty."""
    client = admin(settings)
    for future in client.delete_topics([settings.topic], operation_timeout=10).values():
        future.result(10)
    deadline = time.monotonic() + 30
    while settings.topic in client.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.1)
    ensure_topics(settings, [settings.topic], partitions=1)


@pytest.mark.parametrize("after", [2, 9], ids=["shorter", "as-long-but-different"])
def test_a_projector_ahead_of_the_log_stops_with_one_line_naming_rebuild(
    make_settings: Any, tmp_path: Path, src_env: dict[str, str], after: int
) -> None:
    settings = make_settings(partitions=1)
    first = random_log(seed=21, workflows=2)[:6]
    db = tmp_path / "ledger.duckdb"
    produce_events(settings, first)
    with projecting(settings, db) as daemon:
        daemon.wait_received(len(first))
    assert query_one(db, "SELECT next_offset FROM offsets") == [(len(first),)]

    recreate(settings)
    produce_events(settings, random_log(seed=22, workflows=3)[:after])
    proc = spawn_projector(settings, db, src_env)
    try:
        code = proc.wait(60)
    except Exception:
        proc.kill()
        proc.communicate(timeout=10)
        raise AssertionError("the projector went on past a log behind its offsets") from None
    err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
    assert code == 1 and err[-1].startswith("Error: "), err
    assert "stepledger rebuild" in err[-1] and "Traceback" not in "\n".join(err)
    assert query_one(db, "SELECT next_offset FROM offsets") == [(len(first),)]

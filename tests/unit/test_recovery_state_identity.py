"""A recovery daemon's file state names its step log: a log created again starts afresh."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stepledger.recovery.checkpoint import (
    CheckpointBatch,
    PartitionedCheckpointStore,
    SqliteCheckpointStore,
)


def batch(offset: int) -> CheckpointBatch:
    return CheckpointBatch(positions={0: offset}, upserts={(0, "wf", "s"): ['{"e": 1}']})


def test_the_state_of_another_log_of_the_same_name_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "recovery.sqlite"
    first = SqliteCheckpointStore(path, "g", lambda: "events@one")
    first.save("events", batch(40))
    first.close()
    again = SqliteCheckpointStore(path, "g", lambda: "events@one")
    loaded = again.load("events", 0)
    assert loaded is not None and loaded.next_offset == 40
    again.close()

    caplog.set_level(logging.WARNING, logger="stepledger.recovery")
    recreated = SqliteCheckpointStore(path, "g", lambda: "events@two")
    assert recreated.load("events", 0) is None  # not position 40 of the old log
    assert "another step log of that name" in caplog.text
    recreated.save("events", CheckpointBatch(positions={0: 3}))
    found = recreated.load("events", 0)
    assert found is not None and found.next_offset == 3 and found.steps == {}
    recreated.close()


def test_state_written_before_logs_were_named_is_taken_and_named(tmp_path: Path) -> None:
    path = tmp_path / "recovery.sqlite"
    legacy = SqliteCheckpointStore(path, "g")  # as 0.3.0 wrote it: no log named
    legacy.save("events", batch(40))
    legacy.close()
    upgraded = SqliteCheckpointStore(path, "g", lambda: "events@one")
    loaded = upgraded.load("events", 0)
    assert loaded is not None and loaded.next_offset == 40
    upgraded.save("events", batch(41))
    upgraded.close()
    assert SqliteCheckpointStore(path, "g", lambda: "events@two").load("events", 0) is None


def test_a_shared_directory_checks_each_partitions_file(tmp_path: Path) -> None:
    PartitionedCheckpointStore(tmp_path, "g", lambda: "events@one").save("events", batch(7))
    assert PartitionedCheckpointStore(tmp_path, "g", lambda: "events@two").load("events", 0) is None

"""SIGKILL the projector mid-batch while events stream in; its tables still equal a rebuild."""

from __future__ import annotations

import queue
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.state import replay
from stepledger.projector.rows import step_row
from stepledger.projector.snapshot import latest_snapshot
from tests.integration.projector_helpers import (
    cli,
    produce_events,
    query_one,
    spawn_projector,
    wait_for,
)
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log

pytestmark = pytest.mark.e2e

KILLS = 3
BURST = 300
PAUSE = 0.4


class Incarnation:
    """One projector process, with its JSON log lines read as they come."""

    def __init__(self, settings: Settings, db: Path, env: dict[str, str]) -> None:
        self.proc = spawn_projector(
            settings,
            db,
            env,
            "--batch-size",
            "150",
            "--snapshot-interval",
            "0.5",
            "--session-timeout",
            "2",
            "--log-format",
            "json",
            "--log-level",
            "DEBUG",
        )
        self.starts: queue.Queue[str] = queue.Queue()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("{") and '"records"' in line:
                self.starts.put(line)

    def in_flight(self) -> bool:
        """True when a batch this process started was never committed."""
        started = sum('"records"' in x for x in self.lines)
        return started > sum('"projected"' in x for x in self.lines)

    def batch_started(self, timeout: float) -> None:
        """Wait until this process starts projecting a batch."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.starts.get(timeout=0.1)
                return
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.lines[-20:])
        raise AssertionError("no batch in time:\n" + "".join(self.lines[-20:]))


class Stream:
    """Appends the log in bursts from a thread, so batches are in flight when we kill."""

    def __init__(self, settings: Settings, events: list[ev.Event]) -> None:
        self.settings, self.events = settings, events
        self.sent = 0
        self.hurry = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for start in range(0, len(self.events), BURST):
            self.sent += produce_events(self.settings, self.events[start : start + BURST])
            # Paced while the kills happen, then the rest at once.
            self.hurry.wait(PAUSE)

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hurry.set()
        self.thread.join(120)


def test_killed_mid_batch_repeatedly_the_tables_equal_a_rebuild(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    rng = random.Random(7)
    log = random_log(seed=77, workflows=1200)
    db, rebuilt = tmp_path / "ledger.duckdb", tmp_path / "rebuilt.duckdb"
    mid_batch = 0
    with Stream(settings, log) as stream:
        for _ in range(KILLS):
            victim = Incarnation(settings, db, src_env)
            victim.batch_started(timeout=60)
            assert stream.thread.is_alive(), "the stream ended before every kill"
            # A batch of 150 takes some milliseconds: a short random pause lands the kill
            # inside it (decoding, folding, publishing dead letters or committing).
            time.sleep(rng.uniform(0.0, 0.005))
            victim.proc.send_signal(signal.SIGKILL)
            assert victim.proc.wait(10) == -signal.SIGKILL
            victim.reader.join(10)  # the pipe closed: every line it wrote is read
            mid_batch += victim.in_flight()
        # Restarted while the stream still runs: it must catch up from its stored offsets.
        survivor = Incarnation(settings, db, src_env)
    assert mid_batch >= 1, "no kill landed inside a batch"
    try:
        wait_for(
            lambda: _snapshot_offsets(db) == len(log),
            120,
            "the restarted projector to catch up",
        )
        survivor.proc.send_signal(signal.SIGTERM)
        assert survivor.proc.wait(30) == 0
    finally:
        if survivor.proc.poll() is None:
            survivor.proc.kill()
    done = cli(
        src_env,
        "rebuild",
        "--bootstrap",
        settings.bootstrap,
        "--topic",
        settings.topic,
        "--db",
        str(rebuilt),
        "--no-progress",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    incremental, fresh = table_contents(db), table_contents(rebuilt)
    for table, rows in fresh.items():
        assert incremental[table] == rows, table
    assert len(incremental["events"]) == len({e.event_id for e in log})
    grouped: dict[str, list[ev.Event]] = defaultdict(list)
    for event in log:
        grouped[event.workflow_id].append(event)
    expected = [
        step_row(s, st)
        for w, es in grouped.items()
        for s in [replay(w, es)]
        for st in s.steps.values()
    ]
    assert incremental["steps"] == sorted(expected)


def _snapshot_offsets(db: Path) -> int:
    """Records the latest snapshot has projected (0 before the first one)."""
    snap = latest_snapshot(db)
    if snap is None:
        return 0
    return int(query_one(snap, "SELECT coalesce(sum(next_offset), 0) FROM offsets")[0][0])

"""Helpers for projector tests against the real broker: producing, running, waiting, reading."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
from confluent_kafka import Producer

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.daemon.process import Shutdown
from stepledger.domain import events as ev
from stepledger.errors import ViewStoreError
from stepledger.log import event_headers
from stepledger.projector.daemon import ProjectorOptions, run_projector
from stepledger.projector.engine import BatchReport
from stepledger.projector.snapshot import connect_read_only, latest_snapshot
from stepledger.readers.snapshots import connect_union, shard_snapshots

STEPLEDGER = [sys.executable, "-m", "stepledger"]
CODEC = Codec()


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll until the condition is truthy (and return it), or fail after the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def producer(settings: Settings) -> Producer:
    """A plain producer (acks=all) for writing test input, good or bad."""
    return Producer(
        settings.client_config(**{"acks": "all", "enable.idempotence": True, "linger.ms": 5})
    )


def produce_events(settings: Settings, events: Sequence[ev.Event], topic: str | None = None) -> int:
    """Append events keyed by workflow, with their CloudEvents headers; wait for all acks."""
    out = producer(settings)
    for event in events:
        out.produce(
            topic or settings.topic,
            CODEC.encode(event),
            event.workflow_id.encode(),
            headers=event_headers(event),  # type: ignore[arg-type]
        )
        out.poll(0)
    assert out.flush(30) == 0
    return len(events)


def produce_raw(
    settings: Settings, records: Sequence[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]
) -> None:
    """Append raw (key, value, headers) records, e.g. poison; wait for all acks."""
    out = producer(settings)
    for key, value, headers in records:
        out.produce(settings.topic, value, key, headers=headers)  # type: ignore[arg-type]
    assert out.flush(30) == 0


class ProjectorThread:
    """``run_projector`` in a background thread, with the reports of its batches."""

    def __init__(self, settings: Settings, options: ProjectorOptions) -> None:
        self.shutdown = Shutdown()
        self.reports: list[BatchReport] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(settings, options), daemon=True)

    def _run(self, settings: Settings, options: ProjectorOptions) -> None:
        try:
            run_projector(settings, options, shutdown=self.shutdown, on_batch=self.reports.append)
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    @property
    def received(self) -> int:
        """Records read so far (projected, duplicates, skipped and refused)."""
        return sum(r.received for r in list(self.reports))

    def wait_received(self, count: int, timeout: float = 60) -> None:
        """Wait until at least this many records went through batches."""
        wait_for(
            lambda: self.error is not None or self.received >= count, timeout, f"{count} records"
        )
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Ask it to stop and wait for it."""
        self.shutdown.request()
        self._thread.join(60)
        assert not self._thread.is_alive(), "projector thread did not stop"
        if self.error is not None:
            raise self.error


@contextmanager
def projecting(settings: Settings, db: Path, **options: Any) -> Iterator[ProjectorThread]:
    """Run a projector thread on the settings' topic into db for the block."""
    # One group per test topic: tests share the broker and must not share group members.
    options.setdefault("group", f"projector-{settings.topic}")
    thread = ProjectorThread(settings, ProjectorOptions(db_path=db, **options))
    thread._thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def projector_command(settings: Settings, db: Path, *extra: str) -> list[str]:
    """The ``stepledger project`` command line of a test's projector (its topic's group)."""
    return [
        *STEPLEDGER,
        "project",
        "--bootstrap",
        settings.bootstrap,
        "--topic",
        settings.topic,
        "--dlq-topic",
        settings.dlq_topic,
        "--db",
        str(db),
        "--group",
        f"projector-{settings.topic}",
        *extra,
    ]


def spawn_projector(
    settings: Settings, db: Path, env: dict[str, str], *extra: str
) -> subprocess.Popen[str]:
    """``stepledger project`` as a real process."""
    return subprocess.Popen(
        projector_command(settings, db, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one ``stepledger`` command to completion."""
    return subprocess.run(
        [*STEPLEDGER, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def query_one(path: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of one query against a closed projection file or a snapshot."""
    con = connect_read_only(path)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def snapshot_count(db: Path, table: str = "events") -> int:
    """Rows of a table in the latest snapshot (0 before the first one)."""
    snap = latest_snapshot(db)
    if snap is None:
        return 0
    try:
        return int(query_one(snap, f"SELECT count(*) FROM {table}")[0][0])
    except (duckdb.Error, ViewStoreError):
        return 0


def projected(shards: Path) -> int:
    """Records projected according to a shard directory's snapshots (0 before any)."""
    if not shard_snapshots(shards):
        return 0
    con = connect_union(shards)
    try:
        row = con.execute("SELECT coalesce(sum(next_offset), 0) FROM offsets").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()

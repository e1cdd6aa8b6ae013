"""The lake projector through its catalog and its bucket failing, and as a zombie.

PostgreSQL restarted and the bucket unreachable for 10 s (``moto_server`` SIGSTOPped, then
SIGCONTinued: it keeps its buckets in memory, so it is never restarted) while events keep
arriving: the projector waits and resumes, and the lake equals a rebuild of the log, every
offset exact.  A projector paused past its session (SIGSTOP) while its partition moves to
another member commits nothing once it is continued.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import duckdb

from stepledger.config import Settings
from stepledger.errors import ViewStoreError
from stepledger.projector.rebuild import rebuild as rebuild_file
from stepledger.readers.lake import LakeConfig, connect_lake_reader
from stepledger_dev.lake_stack import LakeStack
from tests.conftest import Factory
from tests.integration.projector_helpers import (
    produce_events,
    projecting,
    projector_command,
    wait_for,
)
from tests.lake.conftest import lake_offsets, read_lake
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log

#: How long the bucket stays unreachable (the issue's figure).
S3_DOWN_S = 10.0
#: One query an analyst runs: rows past their partition's offset, and workflows without
#: their events (or events without their workflow): both 0 in a consistent cut.
CUT = """
    SELECT (SELECT count(*) FROM events e JOIN offsets o USING (topic, partition)
             WHERE e.log_offset >= o.next_offset),
           (SELECT count(DISTINCT workflow_id) FROM events) - (SELECT count(*) FROM workflows),
           (SELECT sum(next_offset) FROM offsets)
"""


class Analyst(threading.Thread):
    """Reads the lake over and over on a connection of its own while the projector writes."""

    def __init__(self, lake: LakeConfig, log: str) -> None:
        super().__init__(daemon=True)
        self.lake, self.log = lake, log
        self.stop = threading.Event()
        self.cuts: list[tuple[int, int, int]] = []

    def run(self) -> None:
        con: duckdb.DuckDBPyConnection | None = None
        while not self.stop.is_set():
            row = None
            try:
                # One connection, one transaction per query: each reads the newest commit.
                con = con or connect_lake_reader(self.lake, self.log)
                row = con.execute(CUT).fetchone()
            except (duckdb.Error, ViewStoreError):
                # Before the first commit, or the catalog restarting: connect again.
                if con is not None:
                    con.close()
                con = None
            if row is not None and row[2] is not None:
                self.cuts.append((int(row[0]), int(row[1]), int(row[2])))
            self.stop.wait(0.02)
        if con is not None:
            con.close()


def test_the_projector_waits_through_a_catalog_restart_and_a_stopped_bucket(
    settings: Settings, stack: LakeStack, lake: LakeConfig, tmp_path: Path
) -> None:
    log = random_log(21, 150)
    thirds = [
        log[: len(log) // 3],
        log[len(log) // 3 : 2 * len(log) // 3],
        log[2 * len(log) // 3 :],
    ]
    analyst = Analyst(lake, settings.topic)
    analyst.start()
    with projecting(settings, tmp_path / "unused.duckdb", lake=lake) as daemon:
        sent = produce_events(settings, thirds[0])
        daemon.wait_received(sent, timeout=120)
        stack.postgres.restart()
        sent += produce_events(settings, thirds[1])
        daemon.wait_received(sent, timeout=120)
        stack.s3.pause()
        try:
            sent += produce_events(settings, thirds[2])
            time.sleep(S3_DOWN_S)  # the fault's duration, not a wait for a condition
            assert daemon.error is None
            assert daemon.received < sent, "a batch committed while the bucket was stopped"
        finally:
            stack.s3.resume()
        wait_for(
            lambda: sum(lake_offsets(lake, settings.topic).values()) == len(log),
            180,
            "the lake to reach the log's end",
        )
        assert daemon.error is None
    analyst.stop.set()
    analyst.join(30)
    # A commit waited through the outage (its batch's time spans it) and then landed.
    assert max(r.seconds for r in daemon.reports) >= S3_DOWN_S / 2
    # Every cut the analyst read was consistent, and it saw the lake grow.
    assert analyst.cuts and all(cut[:2] == (0, 0) for cut in analyst.cuts), analyst.cuts
    assert len({cut[2] for cut in analyst.cuts}) > 1
    rebuilt = tmp_path / "rebuilt.duckdb"
    rebuild_file(settings, rebuilt)
    assert read_lake(lake, settings.topic) == table_contents(rebuilt)


def test_a_projector_paused_past_its_session_commits_nothing_after_its_partition_moved(
    make_settings: Factory, lake: LakeConfig, src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=1)
    env = {**src_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    unused = tmp_path / "unused.duckdb"
    extra = ("--lake", lake.catalog, "--data-path", lake.data_path, "--session-timeout", "3")

    def member(name: str) -> subprocess.Popen[str]:
        with open(tmp_path / f"{name}.log", "w") as err:
            return subprocess.Popen(
                projector_command(settings, unused, *extra),
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
                env=env,
            )

    log = random_log(31, 120)
    first = member("first")
    procs = [first]
    try:
        sent = produce_events(settings, log[:40])
        wait_for(lambda: lake_offsets(lake, settings.topic).get((settings.topic, 0)) == sent, 120,
                 "the first member to project the partition")  # fmt: skip
        procs.append(member("second"))
        joined = tmp_path / "second.log"
        wait_for(lambda: "assigned" in joined.read_text(), 60, "the second member to join")
        os.kill(first.pid, signal.SIGSTOP)
        # Past the first member's session the partition moves to the second one.
        sent += produce_events(settings, log[40:80])
        wait_for(lambda: lake_offsets(lake, settings.topic).get((settings.topic, 0)) == sent, 120,
                 "the second member to take the partition over")  # fmt: skip
        os.kill(first.pid, signal.SIGCONT)
        sent += produce_events(settings, log[80:])
        wait_for(lambda: lake_offsets(lake, settings.topic).get((settings.topic, 0)) == sent, 120,
                 "the log's end in the lake")  # fmt: skip
        time.sleep(2)  # the continued member's late commit, if it made one, lands by now
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    rebuilt = tmp_path / "rebuilt.duckdb"
    rebuild_file(settings, rebuilt)
    assert read_lake(lake, settings.topic) == table_contents(rebuilt)
    assert lake_offsets(lake, settings.topic) == {(settings.topic, 0): len(log)}

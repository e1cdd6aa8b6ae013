"""Scaling out: several projectors in one group, one shard per partition, a kill mid-run."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from stepledger.config import Settings
from stepledger.projector.schema import TABLES
from stepledger.snapshots import connect_union, shard_snapshots
from tests.conftest import Factory
from tests.integration.projector_helpers import (
    STEPLEDGER,
    cli,
    produce_events,
    wait_for,
)
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log

PARTITIONS = 8
NEW_SHARD = re.compile(r"no shard for (\S+)\[(\d+)\]")


def start(
    settings: Settings,
    shards: Path,
    env: dict[str, str],
    log: Path,
    *,
    session_s: str = "2",
    snapshot_s: str = "0.3",
) -> subprocess.Popen[str]:
    with open(log, "w") as err:
        return subprocess.Popen(
            [
                *STEPLEDGER,
                "project",
                "--bootstrap",
                settings.bootstrap,
                "--topic",
                settings.topic,
                "--dlq-topic",
                settings.dlq_topic,
                "--db",
                str(shards),
                "--group",
                f"projector-{settings.topic}",
                "--session-timeout",
                session_s,
                "--snapshot-interval",
                snapshot_s,
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env=env,
        )


def projected(shards: Path) -> int:
    """Records projected according to the shards' snapshots (0 before there are any)."""
    if not shard_snapshots(shards):
        return 0
    con = connect_union(shards)
    try:
        row = con.execute("SELECT coalesce(sum(next_offset), 0) FROM offsets").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()


def union_contents(shards: Path) -> dict[str, list[tuple[object, ...]]]:
    con = connect_union(shards)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()


def test_three_projectors_one_killed_and_one_added_build_the_union_a_rebuild_builds(
    make_settings: Factory, src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    shards = tmp_path / "shards"
    events = random_log(seed=8, workflows=240)
    half = len(events) // 2
    logs = [tmp_path / f"projector-{i}.log" for i in range(4)]
    procs = [start(settings, shards, src_env, logs[i]) for i in range(3)]
    try:
        produce_events(settings, events[:half])
        wait_for(lambda: projected(shards) >= half, 90, "the first half projected")
        assert len(shard_snapshots(shards)) == PARTITIONS
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        procs.append(start(settings, shards, src_env, logs[3]))
        # Its SIGTERM handler must be installed before the end (on a loaded machine the
        # others projected everything while it was still importing: it died by the signal).
        wait_for(lambda: "projecting" in logs[3].read_text(), 60, "the added projector to start")
        produce_events(settings, events[half:])
        wait_for(lambda: projected(shards) >= len(events), 90, "every record projected")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
    for proc in procs[1:]:
        assert proc.returncode == 0, [log.read_text()[-2000:] for log in logs]

    rebuilt = tmp_path / "rebuilt.duckdb"
    done = cli(
        src_env,
        "rebuild",
        "--bootstrap",
        settings.bootstrap,
        "--topic",
        settings.topic,
        "--dlq-topic",
        settings.dlq_topic,
        "--db",
        str(rebuilt),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    union = union_contents(shards)
    assert sum(o for _, _, o in union["offsets"]) == len(events)
    assert union == table_contents(rebuilt)
    # A partition is projected from offset 0 only when its shard is missing: once each.
    created = [m.groups() for log in logs for m in NEW_SHARD.finditer(log.read_text())]
    assert sorted(int(p) for _, p in created) == list(range(PARTITIONS))


def test_a_lone_projector_paused_past_its_session_loses_its_shards_and_carries_on(
    make_settings: Factory, src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=4)
    shards = tmp_path / "shards"
    events = random_log(seed=9, workflows=80)
    half = len(events) // 2
    log = tmp_path / "projector.log"
    proc = start(settings, shards, src_env, log, session_s="1", snapshot_s="0.05")
    try:
        wait_for(lambda: "assigned" in log.read_text(), 60, "the projector's assignment")
        produce_events(settings, events[:half])
        wait_for(lambda: projected(shards) >= half, 60, "the first half projected")
        # Stopped past its session while the log grows: the group takes its partitions, it
        # gives its shards up when it wakes, and is assigned them again.
        proc.send_signal(signal.SIGSTOP)
        try:
            produce_events(settings, events[half:])
            time.sleep(3.0)  # the fault itself: a pause of three sessions, not a wait
        finally:
            proc.send_signal(signal.SIGCONT)
        wait_for(lambda: projected(shards) >= len(events), 90, "every record projected")
        assert proc.poll() is None, log.read_text()[-3000:]
        text = log.read_text()
        assert "revoked" in text and text.count("assigned") >= 2, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    union = union_contents(shards)
    assert sum(o for _, _, o in union["offsets"]) == len(events)
    assert len(union["events"]) == len({e.event_id for e in events})

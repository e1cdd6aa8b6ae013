"""A shard still locked by a paused previous owner holds its partition back; it stops nothing.

Two ``stepledger project`` processes share a shard directory.  The first is SIGSTOPped
while it owns every partition; the group hands them to the second once the first's
session expires, but the stopped process still holds each shard's DuckDB lock (the fence:
nobody writes beside it).  The second member must neither write beside it nor exit: it
holds the partitions back (paused, ``stepledger_projector_partitions_held``) and takes
each shard once the first is continued and lets it go; then every event is projected.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from stepledger_dev.broker import free_port
from tests.conftest import Factory
from tests.integration.projector_helpers import (
    produce_events,
    projected,
    projector_command,
    wait_for,
)
from tests.unit.projector_logs import random_log

PARTITIONS = 2


def _member(settings: object, shards: Path, log: Path, *extra: str) -> subprocess.Popen[str]:
    with open(log, "w") as err:
        return subprocess.Popen(
            projector_command(
                settings,  # type: ignore[arg-type]
                shards,
                *("--session-timeout", "6", "--snapshot-interval", "0.3"),
                *extra,
            ),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )


def _held_metric(port: int) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return None
    found = re.search(rb"^stepledger_projector_partitions_held (\S+)$", text, re.M)
    return float(found[1]) if found else None


def test_a_shard_locked_by_a_paused_owner_is_held_back_then_taken_and_nothing_stops(
    make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    shards = tmp_path / "shards"
    first_events = random_log(seed=41, workflows=8)
    produce_events(settings, first_events)
    first = _member(settings, shards, tmp_path / "first.log")
    second: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: projected(shards) == len(first_events), 90, "the first member")
        os.kill(first.pid, signal.SIGSTOP)
        port = free_port()
        second = _member(settings, shards, tmp_path / "second.log", "--metrics-port", str(port))
        log = tmp_path / "second.log"
        wait_for(lambda: "held back" in log.read_text(), 90, "the second to hold a shard back")
        # Held back, not stopped: still running past the old 30 s limit's place in the
        # assignment (nothing waits for a lock there now), its partitions counted as held.
        wait_for(lambda: (_held_metric(port) or 0) >= 1, 30, "the held-partitions gauge")
        assert second.poll() is None, log.read_text()[-2000:]
        more = random_log(seed=42, workflows=8)
        produce_events(settings, more)
        os.kill(first.pid, signal.SIGCONT)  # it finds its partitions lost and closes them
        total = len(first_events) + len(more)
        wait_for(lambda: projected(shards) == total, 120, "every event projected")
        assert second.poll() is None, log.read_text()[-2000:]
        # The first member, woken, may project what it fetched before it learns its
        # partitions are lost (under its shard's lock, offsets in the same write): the
        # second takes the shard when the lock is free, not before every event is in.
        wait_for(lambda: "released: projecting from offset" in log.read_text(), 60, "the release")
        wait_for(lambda: _held_metric(port) == 0, 30, "no partition held any more")
        first.send_signal(signal.SIGTERM)
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0, log.read_text()[-2000:]
        assert first.wait(30) == 0, (tmp_path / "first.log").read_text()[-2000:]
        assert "Traceback" not in log.read_text()
    finally:
        for left in (first, second):
            if left is not None and left.poll() is None:
                os.kill(left.pid, signal.SIGCONT)
                left.kill()
                left.wait(10)

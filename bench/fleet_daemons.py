"""The fleet bench's rows 3 and 4: what the daemons make of a fleet's steps.

Row 3, freshness: the projector's published snapshot against the agents' acknowledgements;
row 4, time to decision: the recovery daemon's decisions after every agent process is
SIGKILLed with steps in doubt.  ``bench.fleet``'s docstring describes both.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.concurrency import warm_ledger
from bench.fleet_agent import doubt_tools
from bench.fleet_cluster import LIMIT_S, Cluster, Sizes, agent_env, agent_process, ready, until
from bench.fleet_figures import DECIDING, Doubt, decisions, doubts, lags
from bench.recovery import Running
from stepledger.codec import Codec
from stepledger.kafka.reader import read_topic
from stepledger.readers.snapshots import connect_read_only, latest_snapshot
from stepledger.resolution.registry import ToolRegistry

# -- 3. freshness ------------------------------------------------------------------------------

_SEEN = "SELECT workflow_id, step_id FROM steps WHERE status = 'succeeded' AND workflow_id LIKE ?"


def _watch(
    db: Path, prefix: str, seen: dict[tuple[str, str], float], stop: threading.Event
) -> None:
    """Note when each step of ``prefix`` first shows in the published snapshot (every 50 ms)."""
    while not stop.wait(0.05):
        snap = latest_snapshot(db)
        if snap is None:
            continue
        try:
            con = connect_read_only(snap)
        except Exception:  # replaced between listing and opening: the next poll reads it
            continue
        try:
            rows = con.execute(_SEEN, [f"{prefix}%"]).fetchall()
        except Exception:
            continue
        finally:
            con.close()
        now = time.time()
        for wf, step in rows:
            seen.setdefault((wf, step), now)


def freshness(
    where: Cluster, per_s: float, processes: int, sizes: Sizes, work: Path
) -> tuple[list[float], int, list[float]]:
    """(seconds from ack to visible for each step, steps never seen, each batch's commit
    lag from the projector's log) at ``per_s`` steps/s."""
    settings = where.settings()
    db, log = work / "fresh.duckdb", work / "projector.log"
    with open(log, "w") as err:
        projector = subprocess.Popen(
            [
                *(sys.executable, "-m", "stepledger", "project", "--db", str(db)),
                *("--log-format", "json", "--log-level", "DEBUG"),  # each batch's commit lag
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=agent_env(settings),
        )
    seen: dict[tuple[str, str], float] = {}
    stop = threading.Event()
    try:
        with warm_ledger(settings):  # one workflow, so the first snapshot shows the join done
            pass
        until(lambda: latest_snapshot(db) is not None, "the projector's first snapshot")
        prefix = f"fresh-{uuid.uuid4().hex[:6]}"
        watcher = threading.Thread(target=_watch, args=(db, prefix, seen, stop), daemon=True)
        watcher.start()
        procs = [
            agent_process(
                settings, "paced", sizes.agents, per_s / processes, sizes.fresh_s, f"{prefix}{p}"
            )
            for p in range(processes)
        ]
        acked: dict[tuple[str, str], float] = {}
        for proc in procs:
            out, _ = proc.communicate(timeout=LIMIT_S)
            if proc.returncode != 0:
                raise SystemExit(f"bench.fleet: a paced agent process failed ({proc.returncode})")
            acked.update({(wf, s): at for wf, s, at in json.loads(out.strip().splitlines()[-1])})
        until(lambda: len(seen) >= len(acked), "every step in the snapshot", 30, quiet=True)
        stop.set()
        watcher.join(10)
    finally:
        stop.set()
        projector.send_signal(signal.SIGTERM)
        try:
            projector.wait(60)
        except subprocess.TimeoutExpired:
            projector.kill()
    return (*lags(acked, seen), commit_lags(log.read_text()))


def commit_lags(log: str) -> list[float]:
    """Each batch's lag, oldest event to committed in DuckDB, from the projector's JSON log:
    what the published snapshot adds to it is its interval and its copy.  The first batch
    is left out: it holds the warm-up workflow, written before the projector joined."""
    found = []
    for line in log.splitlines():
        if line.startswith("{") and '"lag_s"' in line:
            lag = json.loads(line).get("lag_s")
            if lag is not None:
                found.append(float(lag))
    return found[1:]


# -- 4. time to decision ---------------------------------------------------------------------


def time_to_decision(where: Cluster, sizes: Sizes, work: Path) -> Any:
    """Kill every agent process with steps in doubt; the decisions, read from the log."""
    settings = where.settings()
    tools = doubt_tools(sizes.timeout_s)
    daemon = Running(settings, work / "recovery", ToolRegistry(list(tools)), grace_s=sizes.grace_s)
    daemon.caught_up_after()
    prefix = f"doubt-{uuid.uuid4().hex[:6]}"
    per = sizes.in_doubt // sizes.doubt_processes
    procs = [
        agent_process(settings, "doubt", per, sizes.timeout_s, f"{prefix}-{p}")
        for p in range(sizes.doubt_processes)
    ]
    try:
        ready(procs, 60 + sizes.timeout_s)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
    killed = time.time()
    expected = per * sizes.doubt_processes
    found: dict[tuple[str, str], Doubt] = {}
    limit = sizes.timeout_s + sizes.grace_s + 120
    try:
        for record in read_topic(settings, Codec(), follow=True, max_time=limit):
            event = record.event
            if event is None or not event.workflow_id.startswith(prefix):
                continue
            doubts([event], prefix, found)
            complete = isinstance(event.body, DECIDING) and len(found) >= expected
            if complete and all(d.decided_at is not None for d in found.values()):
                break
    finally:
        daemon.stop()
    first_deadline = min(d.deadline for d in found.values()).timestamp() if found else killed
    if killed > first_deadline:
        print("[fleet] agents were killed after the first deadline: raise timeout_s", flush=True)
    return decisions(found, sizes.grace_s), expected

"""Ctrl-C during ``run_query``: the worker leaves DuckDB before the connection closes or the
process exits, and a worker DuckDB will not let go of never aborts the process at exit.

Each case runs in its own Python process that sends itself SIGINT while a statement runs.
The connection is the real read-only one, wrapped so that the worker stays inside DuckDB
longer than it takes the main thread to get out: what a loaded machine does at random.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepledger.projector.snapshot import publish_snapshot
from stepledger.projector.store import ProjectionStore

SCRIPT = r"""
import json, os, signal, sys, threading, time
import duckdb
from stepledger.readers import query
from stepledger.readers.snapshots import connect_projection

SLOW_SQL = "SELECT count(*) FROM range(1000000000000) a WHERE a.range % 7 = 3"
stay_inside_s, grace_s = float(sys.argv[2]), float(sys.argv[3])


class SlowToLeave:
    # After its statement is interrupted, the worker runs it again (each run inside DuckDB)
    # until stay_inside_s have passed: an interrupt DuckDB is slow to honour.
    def __init__(self, con):
        self.con, self.started, self.left = con, threading.Event(), threading.Event()
        self.closed_while_inside = False

    def execute(self, sql):
        self.started.set()
        until = None
        try:
            while True:
                try:
                    self.con.execute(sql)
                    return self
                except duckdb.InterruptException:
                    until = until or time.monotonic() + stay_inside_s
                    if time.monotonic() > until:
                        raise
        finally:
            self.left.set()

    @property
    def description(self):
        return self.con.description

    def fetchall(self):
        return self.con.fetchall()

    def interrupt(self):
        self.con.interrupt()

    def close(self):
        self.closed_while_inside = self.closed_while_inside or not self.left.is_set()
        self.con.close()


wrapped = []


def connect_slow_to_leave(path):
    wrapped.append(SlowToLeave(connect_projection(path)))
    return wrapped[-1]


query.connect_projection = connect_slow_to_leave
query.INTERRUPT_GRACE_S = grace_s


def ctrl_c():
    wrapped_started = lambda: wrapped and wrapped[0].started.is_set()
    while not wrapped_started():
        time.sleep(0.01)
    busy_from = time.process_time()
    while time.process_time() < busy_from + 0.5:  # DuckDB is running the statement
        time.sleep(0.01)
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)


sent = []
threading.Thread(target=ctrl_c, daemon=True).start()
try:
    query.run_query(sys.argv[1], SLOW_SQL, timeout=None)
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
returned = time.monotonic()
con = wrapped[0]
print(json.dumps({
    "error": error,
    "seconds_after_ctrl_c": returned - sent[0],
    "left_duckdb_before_return": con.left.is_set(),
    "closed_while_inside": con.closed_while_inside,
}), flush=True)
"""


def run_interrupted(
    env: dict[str, str], tmp_path: Path, stay_inside_s: float, grace_s: float
) -> tuple[int, str, str]:
    db = tmp_path / "ledger.duckdb"
    with ProjectionStore(db) as store:
        publish_snapshot(store)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(db), str(stay_inside_s), str(grace_s)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_ctrl_c_waits_for_the_worker_to_leave_duckdb_before_closing(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    code, out, err = run_interrupted(src_env, tmp_path, stay_inside_s=1.5, grace_s=10)
    assert code == 0 and "terminate" not in err, (code, out, err)
    seen = json.loads(out)
    assert seen["error"] == "ViewStoreError: the query was interrupted", seen
    assert seen["left_duckdb_before_return"] and not seen["closed_while_inside"], seen
    assert 1.0 < seen["seconds_after_ctrl_c"] < 10, seen


def test_a_worker_duckdb_does_not_let_go_of_ends_the_process_without_an_abort(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    code, out, err = run_interrupted(src_env, tmp_path, stay_inside_s=60, grace_s=0.5)
    seen = json.loads(out)
    assert seen["error"] == "ViewStoreError: the query was interrupted", seen
    assert seen["seconds_after_ctrl_c"] < 5 and not seen["closed_while_inside"], seen
    # At exit the worker is still inside DuckDB: finalizing would kill it there (SIGABRT).
    assert not seen["left_duckdb_before_return"] and code == 1 and "terminate" not in err, (
        code,
        err,
    )

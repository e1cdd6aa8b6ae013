"""One writer per projection file for the writer's whole life, snapshots included."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from stepledger.config import Settings
from stepledger.projector.snapshot import latest_snapshot
from tests.integration.projector_helpers import (
    cli,
    produce_events,
    snapshot_count,
    spawn_projector,
    wait_for,
)
from tests.integration.test_projector import saga_log


def one_line_error(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """The stderr of a process that must refuse to start: exit 1, one line, no traceback."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        raise AssertionError("a second writer ran on a file a projector owns") from None
    err = (proc.stderr.read() if proc.stderr else "").strip()
    assert code == 1 and "\n" not in err and "Traceback" not in err, err
    return err


def test_after_a_snapshot_a_second_projector_and_a_forced_rebuild_are_refused(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    db = tmp_path / "ledger.duckdb"
    log = saga_log()
    owner = spawn_projector(settings, db, src_env, "--snapshot-interval", "0.2")
    try:
        first = wait_for(lambda: latest_snapshot(db), 30, "the first snapshot")
        produce_events(settings, log)
        # Several snapshots published since the start, each one a copy of the live file.
        wait_for(lambda: snapshot_count(db) == len(log), 60, "the events in a snapshot")
        assert first.exists() and owner.poll() is None

        second = spawn_projector(settings, db, src_env)
        assert "cannot open projection" in one_line_error(second)

        forced = cli(
            src_env,
            "rebuild",
            "--bootstrap",
            settings.bootstrap,
            "--topic",
            settings.topic,
            "--db",
            str(db),
            "--force",
            "--no-progress",
        )
        assert forced.returncode == 1 and "in use" in forced.stderr, forced.stderr
        assert "Traceback" not in forced.stderr
        assert owner.poll() is None
    finally:
        owner.send_signal(signal.SIGTERM)
        _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert not list(tmp_path.glob("*.partial"))

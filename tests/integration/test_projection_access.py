"""A fleet's projection directory is readable by its own analysts only, and another's analyst
is told so in one line (it was a PermissionError trace).

The directory is group-owned by the fleet's analysts (mode 2750, files 0640, as
docs/analysts.md sets it up); ``stepledger query`` runs as a process of that group and as
one of another group.  As root the test drops every capability (``setpriv``), so the file
modes decide, as they do for an ordinary user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepledger.log import InMemoryEventLog
from tests.integration.test_inbox import everything
from tests.unit.projector_harness import project, to_messages

OWNER, ANALYSTS, OTHERS = 4000, 4242, 4343
SQL = "SELECT fleet_id, count(*) AS n FROM workflows GROUP BY ALL ORDER BY ALL"


def _query(db: Path, gid: int | None, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "stepledger", "query", "--db", str(db), "--csv", SQL]
    if gid is not None:  # root without capabilities, in one group: the modes decide
        drop = ["setpriv", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all"]  # fmt: skip
        command = [*drop, *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_only_the_fleets_analysts_read_its_projection_and_others_get_one_line(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    home = tmp_path / "orders"
    home.mkdir()
    log = InMemoryEventLog()
    for event in everything():
        log.append(event)
    project(home / "ledger.duckdb", to_messages(log.events), largest_batch=500)
    env = {**src_env, "HOME": str(tmp_path)}
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv (util-linux) is needed to drop root's capabilities")
        for path in (home, *home.iterdir()):
            os.chown(path, OWNER, ANALYSTS)
            path.chmod(0o2750 if path.is_dir() else 0o640)
        mine = _query(home / "ledger.duckdb", ANALYSTS, env)
        assert mine.returncode == 0, mine.stderr
        assert mine.stdout.split() == ["fleet_id,n", "fleet-a,2", "fleet-b,2"]
        theirs = _query(home / "ledger.duckdb", OTHERS, env)
    else:
        home.chmod(0o000)
        try:
            theirs = _query(home / "ledger.duckdb", None, env)
        finally:
            home.chmod(0o750)
    assert theirs.returncode == 1 and theirs.stdout == ""
    (line,) = theirs.stderr.splitlines()
    assert line.startswith(f"Error: not allowed to read {home}/ledger.duckdb: Permission denied")
    assert "readable by its own analysts only" in line

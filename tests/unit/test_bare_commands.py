"""Every command on a bare install: --help works; without its extra, one line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_without_its_extra_is_one_line_naming_it() -> None:
    # The script CI runs in a fresh venv holding only the wheel, here with the extras'
    # libraries made unimportable: demo, broker, inbox, inbox-user, chaos and simulate
    # printed a traceback from an import inside the command's body.
    script = ROOT / ".ci" / "bare_commands.py"
    done = subprocess.run(
        [sys.executable, str(script), "--simulate-bare"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("bare commands: 0 failures")

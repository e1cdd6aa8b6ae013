"""The inbox's --allowed-host names reach the app's Host check; other names get 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from stepledger.cli import cli
from stepledger.inbox import server
from stepledger.inbox.app import InboxConfig, create_app


def test_allowed_hosts_from_the_option_and_the_variable_reach_serve(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[server.ServeOptions] = []

    def fake_serve(settings: Any, options: server.ServeOptions, announce: Any = print) -> None:
        seen.append(options)

    monkeypatch.setattr(server, "serve", fake_serve)
    db = str(tmp_path / "x.duckdb")
    args = ["inbox", "--db", db, "--allowed-host", "inbox.example.test"]
    done = CliRunner().invoke(cli, [*args, "--allowed-host", "svc"])
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(
        cli, ["inbox", "--db", db], env={"STEPLEDGER_INBOX_ALLOWED_HOSTS": "a.test  b.test"}
    )
    assert done.exit_code == 0, done.output
    assert [o.allowed_hosts for o in seen] == [("inbox.example.test", "svc"), ("a.test", "b.test")]


def test_a_host_not_allowed_gets_400_and_an_allowed_one_does_not(tmp_path: Path) -> None:
    config = InboxConfig(
        db_path=tmp_path / "none.duckdb",
        token="t" * 20,
        allowed_hosts=("127.0.0.1", "inbox.example.test"),
    )
    app = create_app(config, answerer=None)  # type: ignore[arg-type]  # no answer is posted
    allowed = TestClient(app, base_url="http://inbox.example.test", follow_redirects=False)
    assert allowed.get("/healthz").status_code != 400
    other = TestClient(app, base_url="http://evil.example.test", follow_redirects=False)
    assert other.get("/healthz").status_code == 400

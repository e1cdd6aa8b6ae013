"""`recover`'s state options since the changelog is the one store: refused, ignored, left behind.

None of these reach a broker: each is decided before the daemon starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stepledger.cli import cli
from stepledger.cli._common import run_guarded


def recover(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    argv = ["stepledger", "recover", "--bootstrap", "127.0.0.1:9", *args]
    monkeypatch.setattr("sys.argv", argv)
    return run_guarded(cli)


def test_shared_state_is_refused_in_one_line_naming_the_upgrade(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert recover(monkeypatch, "--shared-state", str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--shared-state is gone" in err and "changelog" in err and "CHANGELOG" in err


def test_state_in_kafka_and_an_old_state_file_are_one_warning_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "recovery.sqlite").write_bytes(b"")  # what the local store left behind
    # No tools given: the run stops there, after the state options were looked at.
    code = recover(
        monkeypatch, "--state-in-kafka", "--state-dir", str(tmp_path), "--no-entry-points"
    )
    assert code == 1
    err = capsys.readouterr().err  # the daemon's log lines (JSON) and the error
    assert err.count("--state-in-kafka is deprecated and does nothing") == 1
    assert err.count("recovery.sqlite is no longer read") == 1

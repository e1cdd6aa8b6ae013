"""Every port option with its port taken: one line, a non-zero exit, no traceback.

No broker is needed: each command binds its ports before it reaches Kafka (the bootstrap
here answers nobody), so a busy port is the first thing it reports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

OPTIONS = {
    "project --metrics-port": ["project", "--db", "{tmp}/p.duckdb", "--metrics-port", "{port}"],
    "recover --metrics-port": ["recover", "--state-dir", "{tmp}/r", "--metrics-port", "{port}"],
    "checkpoint --metrics-port": ["checkpoint", "--metrics-port", "{port}"],
    "inbox --metrics-port": [
        "inbox",
        "--db",
        "{tmp}/i.duckdb",
        "--port",
        "0",
        "--metrics-port",
        "{port}",
    ],
    "inbox --port": ["inbox", "--db", "{tmp}/i.duckdb", "--port", "{port}"],
    "broker --port": ["broker", "--port", "{port}"],
}


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_a_taken_port_is_one_line(option: str, busy_port: int, tmp_path: Path) -> None:
    args = [a.format(tmp=tmp_path, port=busy_port) for a in OPTIONS[option]]
    env = dict(
        os.environ,
        STEPLEDGER_BOOTSTRAP="127.0.0.1:1",
        STEPLEDGER_INBOX_TOKEN="t" * 24,
        STEPLEDGER_TOOLS="stepledger_dev.examples.tools:registry",
        STEPLEDGER_PAYMENTS_URL="http://127.0.0.1:1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "stepledger", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert len(lines) == 1, done.stderr
    assert str(busy_port) in lines[0] and "in use" in lines[0], lines[0]

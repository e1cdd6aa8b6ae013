"""CLI edges that used to hang, mislead or print a traceback: each is one line and an exit code."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepledger.config import Settings
from stepledger.projector.snapshot import publish_snapshot
from stepledger.projector.store import ProjectionStore
from tests.integration.projector_helpers import wait_for

STEPLEDGER = [sys.executable, "-m", "stepledger"]
SLOW_SQL = "SELECT count(*) FROM range(1000000000000) a WHERE a.range % 7 = 3"


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STEPLEDGER, *args], capture_output=True, text=True, env=env, timeout=120
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    err = result.stderr.strip()
    assert result.returncode != 0 and "\n" not in err and "Traceback" not in err, err
    return err


def projection(tmp_path: Path) -> Path:
    db = tmp_path / "ledger.duckdb"
    with ProjectionStore(db) as store:
        publish_snapshot(store)
    return db


def test_broker_on_a_busy_port_fails_with_one_line(src_env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(src_env, "broker", "--port", str(port))
    assert "in use" in one_line(result) and "listening" not in result.stdout


def test_init_says_when_an_existing_topic_has_fewer_partitions(
    make_settings: Any, src_env: dict[str, str]
) -> None:
    settings: Settings = make_settings(partitions=3)
    kafka = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    result = run(src_env, "init", *kafka, "--dlq-topic", settings.dlq_topic, "--partitions", "8")
    assert "has 3 partitions, not 8" in one_line(result)
    same = run(src_env, "init", *kafka, "--dlq-topic", settings.dlq_topic, "--partitions", "3")
    assert same.returncode == 0 and "(3 partitions)" in same.stdout


def test_query_stops_at_its_timeout(tmp_path: Path, src_env: dict[str, str]) -> None:
    db = projection(tmp_path)
    result = run(src_env, "query", "--db", str(db), "--timeout", "0.5", SLOW_SQL)
    assert "longer than 0.5s" in one_line(result)


def test_ctrl_c_during_a_query_is_one_line(tmp_path: Path, src_env: dict[str, str]) -> None:
    db = projection(tmp_path)
    proc = subprocess.Popen(
        [*STEPLEDGER, "query", "--db", str(db), SLOW_SQL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=src_env,
    )
    try:
        # Inside the query, not still starting: the projection is open and the process has
        # burnt CPU since (a CPU figure alone was reached by imports on a slow machine, and
        # the Ctrl-C landed before the query began).
        wait_for(lambda: opened_under(proc.pid, tmp_path), 60, "the projection to be opened")
        started = cpu_seconds(proc.pid)
        wait_for(lambda: cpu_seconds(proc.pid) > started + 0.5, 60, "the query to be running")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and lines == ["Error: the query was interrupted"], err


def test_a_bad_kafka_option_and_a_binary_config_file_are_one_line(
    tmp_path: Path, src_env: dict[str, str], bootstrap: str
) -> None:
    bad_option = run(src_env, "tail", "--bootstrap", bootstrap, "-X", "no.such.thing=1")
    assert "no.such.thing" in one_line(bad_option)
    binary = tmp_path / "config.toml"
    binary.write_bytes(b"\xff\xfe\x00\x01binary")
    result = run(src_env, "tail", "--bootstrap", bootstrap, "--config", str(binary))
    assert "not text" in one_line(result)


def opened_under(pid: int, directory: Path) -> bool:
    """True when the process holds a file under ``directory`` open."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        targets = [fd.readlink() for fd in fds.iterdir()]
    except OSError:  # the process is gone, or a descriptor closed while listed
        return False
    return any(directory in target.parents for target in targets)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def test_ctrl_c_while_the_command_imports_is_one_line(src_env: dict[str, str]) -> None:
    """The console script's entry imports the package inside its guard: a Ctrl-C that lands
    while it imports is one line and 130, not a traceback (the import is made to raise the
    KeyboardInterrupt a real Ctrl-C there would)."""
    script = (
        "import builtins, _stepledger_cli\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'stepledger.cli':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "_stepledger_cli.main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=src_env, timeout=60
    )
    assert result.returncode == 130 and result.stderr == "Interrupted.\n", result.stderr

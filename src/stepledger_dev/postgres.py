"""A throwaway PostgreSQL server on loopback: the peer bench's DBOS and the lake's catalog.

:class:`PostgresServer` runs ``initdb`` into a temporary directory and ``pg_ctl start`` on a
free loopback port (``listen_addresses=127.0.0.1``, its Unix socket in the same temporary
directory, ``fsync=on`` and ``synchronous_commit=on``: every commit waits for the disk, the
honest production setting); ``restart`` stops it (``-m fast``) and starts it again on the
same port, as a fault test needs; ``stop`` ends it and the directory is deleted.
``initdb`` refuses to run as root: as root the cluster belongs to an unprivileged account
(``postgres`` if it exists, else ``nobody``).  ``postgres_missing()`` says why no server can
start here (no server binaries), or ``None``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

_SEARCHED = ("/usr/lib/postgresql", "/usr/local/pgsql", "/opt/homebrew/opt/postgresql")


def postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH first, then the usual places."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for root in _SEARCHED:
        base = Path(root)
        if not base.is_dir():
            continue
        # Debian keeps one directory per major version: the newest wins.
        for candidate in [*sorted(base.glob("*/bin"), reverse=True), base / "bin"]:
            if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
                return candidate
    return None


def postgres_missing() -> str | None:
    """Why no cluster can start here, or None."""
    if postgres_bin() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql"
    return None


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _owner() -> tuple[str, int, int] | None:
    """The unprivileged account to run the cluster as when we are root, else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return name, entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root with neither a 'postgres' nor a 'nobody' account")


class PostgresServer:
    """One cluster in a temporary directory, on a free loopback port, trust authentication."""

    def __init__(self, root: Path, timeout_s: float = 60) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError(postgres_missing())
        self.bindir = bindir
        self.root = root
        self.timeout_s = timeout_s
        self.data, self.log = root / "data", root / "server.log"
        self.port = free_port()
        owner = _owner()
        self._uid = self._gid = None
        if owner is not None:
            _, self._uid, self._gid = owner
            os.chown(root, self._uid, self._gid)
        # --no-sync only skips initdb's own final flush of the template files; the server
        # runs with fsync on.
        self._run(str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A",
                  "trust", "-E", "UTF8", "--no-sync")  # fmt: skip

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT`` (append ``/dbname``)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def dsn(self, dbname: str) -> str:
        """A libpq DSN of one database of the cluster."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c fsync=on -c synchronous_commit=on -c max_connections=200"
        )
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-o", options, "-w", "-t", str(int(self.timeout_s)), "start")  # fmt: skip

    def stop(self) -> None:
        """Stop the server (fast: open sessions are ended)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                  "-t", str(int(self.timeout_s)), "stop")  # fmt: skip

    def restart(self) -> None:
        """Stop and start again on the same port, data kept."""
        self.stop()
        self.start()

    def create_database(self, name: str) -> None:
        """Create a database (psql from the same binaries)."""
        self.sql("postgres", f'CREATE DATABASE "{name}"')

    def sql(self, database: str, statement: str) -> str:
        """Run one SQL statement with psql; its output."""
        return self._run(str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                         "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-At",
                         "-c", statement)  # fmt: skip

    def sql_file(self, database: str, path: Path) -> str:
        """Run a SQL script with psql (its backquoted variables read this environment)."""
        return self._run(str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                         "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-f",
                         str(path))  # fmt: skip

    def _run(self, *argv: str) -> str:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=self.timeout_s,
            env=env,
            cwd=self.root,
            user=self._uid,
            group=self._gid,
            extra_groups=[] if self._uid is not None else None,
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).decode(errors="replace")[-1500:]
            server = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {tail}\n{server}")
        return done.stdout.decode(errors="replace")


@contextlib.contextmanager
def postgres_server(timeout_s: float = 60) -> Iterator[PostgresServer]:
    """A fresh, started cluster on loopback, stopped and deleted at the end."""
    with tempfile.TemporaryDirectory(prefix="stepledger-pg-") as tmp:
        server = PostgresServer(Path(tmp), timeout_s)
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                server.stop()


@contextlib.contextmanager
def postgres_cluster(timeout_s: float = 60) -> Iterator[str]:
    """A fresh cluster on loopback; yields ``postgresql://postgres@127.0.0.1:PORT``."""
    with postgres_server(timeout_s) as server:
        yield server.url

"""A throwaway PostgreSQL cluster for the peer bench: DBOS Transact's production setup.

``postgres_cluster()`` runs ``initdb`` into a temporary directory and ``pg_ctl start`` on a
free loopback port (``listen_addresses=127.0.0.1``, its Unix socket in the same temporary
directory, ``fsync=on`` and ``synchronous_commit=on``: every commit waits for the disk, the
honest production setting), yields a ``postgresql://`` URL prefix, and stops the cluster
(``pg_ctl stop -m fast``) and deletes it at the end.  ``initdb`` refuses to run as root: as
root the cluster belongs to an unprivileged account (``postgres`` if it exists, else
``nobody``).  ``postgres_missing()`` says why the cluster cannot start here (no server
binaries), or ``None``.
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


@contextlib.contextmanager
def postgres_cluster(timeout_s: float = 60) -> Iterator[str]:
    """A fresh cluster on loopback; yields ``postgresql://postgres@127.0.0.1:PORT``."""
    bindir = postgres_bin()
    if bindir is None:
        raise RuntimeError(postgres_missing())
    owner = _owner()
    with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
        root = Path(tmp)
        data, log = root / "data", root / "server.log"
        uid: int | None = None
        gid: int | None = None
        groups: list[int] | None = None
        if owner is not None:
            _, uid, gid = owner
            groups = []
            os.chown(root, uid, gid)
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}

        def run(*argv: str) -> None:
            done = subprocess.run(
                argv,
                capture_output=True,
                timeout=timeout_s,
                env=env,
                cwd=root,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).decode(errors="replace")[-1500:]
                server = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise RuntimeError(f"{' '.join(argv[:2])} failed: {tail}\n{server}")

        # --no-sync only skips initdb's own final flush of the template files; the server
        # below runs with fsync on.
        run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync")  # fmt: skip
        port = free_port()
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root} "
            "-c fsync=on -c synchronous_commit=on -c max_connections=200"
        )
        pg_ctl = str(bindir / "pg_ctl")
        run(pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t",
            str(int(timeout_s)), "start")  # fmt: skip
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}"
        finally:
            with contextlib.suppress(Exception):
                run(pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop")

"""Restate beside stepledger in the peer bench: its server from npm, its Python SDK.

``restate_missing()`` says why Restate cannot run here (no ``restate-server`` binary, or no
``restate-sdk``/``hypercorn``), or ``None``.  The server is the npm package's binary
(``npm install --prefix ~/.cache/stepledger/restate @restatedev/restate-server@1.7.12``, or
``restate-server`` on PATH, or ``$STEPLEDGER_RESTATE_SERVER``), started on three free
loopback ports (ingress, admin, node) with a temporary base directory and its defaults
otherwise (its local log and RocksDB fsync their writes), stopped at the end.  The service is
``bench.restate_service`` served by Hypercorn in its own process (Restate's architecture:
the server drives the service over HTTP/2), registered with the admin API.  Agents are HTTP
clients of the ingress: each workflow is one invocation of ``peer/work``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import agents_in_threads
from bench.pg import free_port

VERSION = "1.7.12"
CACHE = Path.home() / ".cache" / "stepledger" / "restate"


def restate_server_bin() -> Path | None:
    """The ``restate-server`` binary: the env override, PATH, then the npm cache."""
    override = os.environ.get("STEPLEDGER_RESTATE_SERVER")
    if override:
        return Path(override)
    found = shutil.which("restate-server")
    if found:
        return Path(found)
    cached = CACHE / "node_modules" / ".bin" / "restate-server"
    return cached if cached.exists() else None


def restate_missing() -> str | None:
    """Why Restate cannot run here, or None."""
    if restate_server_bin() is None:
        return (
            "no restate-server binary (npm install --prefix ~/.cache/stepledger/restate "
            f"@restatedev/restate-server@{VERSION})"
        )
    for module in ("restate", "hypercorn"):
        if importlib.util.find_spec(module) is None:
            return f"no {module} module (pip install restate-sdk==1.2.0 hypercorn)"
    return None


def _wait_until(check: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s")


@dataclass
class Restate:
    """A running server and the service's port."""

    ingress: str
    admin: str
    service_port: int
    workdir: Path
    service: subprocess.Popen[bytes] | None = None

    def start_service(self, kill_at: int = -1) -> subprocess.Popen[bytes]:
        """The service process on its port (the deployment's URI), ready to serve."""
        argv = [sys.executable, "-m", "bench.restate_service", str(self.service_port)]
        self.service = subprocess.Popen(
            [*argv, str(self.workdir), str(kill_at)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self.service

    def wait_service(self) -> None:
        """Until the service's port accepts connections."""
        import socket

        def accepts() -> bool:
            with socket.create_connection(("127.0.0.1", self.service_port), timeout=1):
                return True

        _wait_until(accepts, "restate service")

    def stop_service(self) -> None:
        """SIGKILL the service process: it keeps no state (the server holds the journals),
        and Hypercorn's ``serve`` waits out SIGTERM."""
        if self.service is not None and self.service.poll() is None:
            self.service.kill()
            self.service.wait(10)
        self.service = None

    def register(self) -> None:
        """Register the service's deployment with the admin API."""
        import httpx

        uri = f"http://127.0.0.1:{self.service_port}"
        done = httpx.post(f"{self.admin}/deployments", json={"uri": uri, "force": True}, timeout=60)
        done.raise_for_status()


@contextlib.contextmanager
def restate_running(workdir: Path) -> Iterator[Restate]:
    """The server on loopback, the service started and registered; all stopped after."""
    import httpx

    binary = restate_server_bin()
    assert binary is not None
    ingress, admin, node = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="bench-restate-") as tmp:
        env = {
            **os.environ,
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{node}",
            "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{node}",
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress}",
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin}",
            "RESTATE_DISABLE_TELEMETRY": "true",
            "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "512MiB",
            "RESTATE_SHUTDOWN_TIMEOUT": "10s",
        }
        argv = [str(binary), "--no-logo", "--listen-mode", "tcp", "--base-dir", tmp]
        with (Path(tmp) / "server.log").open("wb") as log:
            server = subprocess.Popen([*argv, "--node-name", "bench"], env=env, stdout=log,
                                      stderr=subprocess.STDOUT)  # fmt: skip
        running = Restate(f"http://127.0.0.1:{ingress}", f"http://127.0.0.1:{admin}",
                          free_port(), workdir)  # fmt: skip
        try:
            _wait_until(
                lambda: httpx.get(f"{running.admin}/health", timeout=2).status_code == 200,
                "restate-server admin",
            )
            _wait_until(
                lambda: (
                    httpx.get(f"{running.ingress}/restate/health", timeout=2).status_code == 200
                ),
                "restate-server ingress",
            )
            running.start_service()
            running.wait_service()
            running.register()
            yield running
        finally:
            running.stop_service()
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)


def restate_figures(
    restate: Restate, steps: int, shape: dict[int, tuple[int, int]], warm: int
) -> dict[str, Any]:
    """Sequential latencies (inside the handler, after ``warm`` unmeasured steps), then
    steps/s of threads and asyncio agents."""
    import httpx

    url = f"{restate.ingress}/peer"
    httpx.post(f"{url}/seq", json=warm, timeout=600).raise_for_status()
    latencies = httpx.post(f"{url}/seq", json=steps, timeout=600).json()
    figures: dict[str, Any] = {"latencies": latencies}
    # One client per thread, made before the clock starts (as the Ledger and DBOS are).
    clients = [httpx.Client(timeout=600) for _ in range(max(shape))]
    for agents, (workflows, size) in shape.items():

        def agent(index: int, workflows: int = workflows, size: int = size) -> int:
            client = clients[index]
            for _ in range(workflows):
                client.post(f"{url}/work", json=size).raise_for_status()
            return workflows * size

        def in_asyncio(workflows: int = workflows, size: int = size, n: int = agents) -> float:
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)

            async def main() -> float:
                async with httpx.AsyncClient(timeout=600, limits=limits) as client:

                    async def async_agent(index: int) -> int:
                        for _ in range(workflows):
                            (await client.post(f"{url}/work", json=size)).raise_for_status()
                        return workflows * size

                    return await _gathered(n, async_agent)

            return asyncio.run(main())

        figures[f"threads{agents}"] = agents_in_threads(agents, agent)
        figures[f"asyncio{agents}"] = in_asyncio()
    for client in clients:
        client.close()
    return figures


async def _gathered(agents: int, agent: Any) -> float:
    began = time.perf_counter()
    counts = await asyncio.gather(*(agent(n) for n in range(agents)))
    elapsed = time.perf_counter() - began
    assert sum(counts) == agents * counts[0] > 0, counts
    return float(sum(counts) / elapsed)


def restate_kill_and_resume(restate: Restate, steps: int) -> tuple[float, int]:
    """Seconds from starting a new service process to the killed workflow's end, re-runs."""
    import httpx

    effects = restate.workdir / "effects-restate"
    effects.unlink(missing_ok=True)
    restate.stop_service()
    dying = restate.start_service(kill_at=steps // 2)
    restate.wait_service()
    key = uuid.uuid4().hex
    sent = httpx.post(
        f"{restate.ingress}/peer/long/send",
        json=steps,
        headers={"idempotency-key": key},
        timeout=60,
    )
    sent.raise_for_status()
    invocation = sent.json()["invocationId"]
    assert dying.wait(300) == -signal.SIGKILL, dying.returncode
    began = time.perf_counter()
    restate.start_service()
    result = httpx.get(f"{restate.ingress}/restate/invocation/{invocation}/attach", timeout=600)
    elapsed = time.perf_counter() - began
    result.raise_for_status()
    calls = effects.read_text().splitlines()
    assert set(calls) == {str(i) for i in range(steps)}, "restate: steps missing"
    return elapsed, len(calls) - steps

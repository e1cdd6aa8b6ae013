"""Every stepledger service of docker-compose.yml starts healthy with its own command and
environment, run as a process (no Docker engine here).

The compose file is read as compose reads it: ``${X:-default}`` expanded as a fresh shell
would (no X set, so the file's defaults count), ``init`` first and to completion, as
``service_completed_successfully`` orders it, then every daemon, each until its ``/readyz``
answers 200 and its own healthcheck command passes. What only a container has is mapped to
the test's loopback machine: the broker ``kafka:19092`` to the test broker, ``/data`` into
``tmp_path``, each published port to a free loopback port, ``0.0.0.0`` to ``127.0.0.1``
(nothing here listens beyond loopback), and the step-log topic to a fresh name (the broker
is shared with other tests; every other topic and group derives from it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepledger.cli._tools import NO_TOOLS_NOTICE
from stepledger_dev.broker import free_port
from tests.conftest import unique

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
INTERNAL_BROKER = "kafka:19092"
#: The whole start: init, then each daemon ready (each polled within what is left).
BUDGET_S = 30.0
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """``${X}`` and ``${X:-default}`` as compose expands them (``$$`` is a literal ``$``)."""
    parts = text.split("$$")
    expanded = [
        _VARIABLE.sub(lambda m: env.get(m["name"]) or (m["default"] or ""), part) for part in parts
    ]
    for part in expanded:
        assert "$" not in part, f"a compose variable form this test does not expand: {text!r}"
    return "$".join(expanded)


def stepledger_services(
    compose: dict[str, Any], profile: str | None = None
) -> dict[str, dict[str, Any]]:
    """The services whose command is a ``stepledger`` command (the broker is not one), of
    the default set (``docker compose up``) or of one profile's."""
    services: dict[str, dict[str, Any]] = compose["services"]
    return {
        name: spec
        for name, spec in services.items()
        if isinstance(spec.get("command"), list)
        and spec["command"][0] == "stepledger"
        and (profile in spec.get("profiles", []) if profile else not spec.get("profiles"))
    }


def one_shots(services: Mapping[str, dict[str, Any]]) -> list[str]:
    """Services another waits for to *complete*: jobs, run to exit 0 first."""
    waited = {
        dep
        for spec in services.values()
        for dep, how in (spec.get("depends_on") or {}).items()
        if how.get("condition") == "service_completed_successfully"
    }
    return sorted(waited & set(services))


class Local:
    """How one service's container facts map onto this machine."""

    def __init__(self, bootstrap: str, data: Path, topic: str) -> None:
        self.bootstrap, self.data, self.topic = bootstrap, data, topic
        self.ports: dict[str, int] = {}

    def publish(self, spec: Mapping[str, Any]) -> dict[str, int]:
        """Each published container port -> a free loopback port."""
        mapped = {}
        for entry in spec.get("ports", []):
            container = str(entry).rsplit(":", 1)[-1]
            mapped[container] = free_port()
        self.ports = mapped
        return mapped

    def value(self, text: str) -> str:
        text = interpolate(text, {})
        if text in self.ports:
            return str(self.ports[text])
        if text == "0.0.0.0":
            return "127.0.0.1"
        if text.startswith("/data"):
            return str(self.data) + text.removeprefix("/data")
        return text.replace(INTERNAL_BROKER, self.bootstrap)

    def environment(self, spec: Mapping[str, Any]) -> dict[str, str]:
        own = {key: self.value(str(value)) for key, value in spec.get("environment", {}).items()}
        assert own.get("STEPLEDGER_BOOTSTRAP") == self.bootstrap, own
        own["STEPLEDGER_TOPIC"] = self.topic
        # The host's STEPLEDGER_* would not reach a container: only the file's count here.
        host = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
        return {**host, **own}

    def command(self, spec: Mapping[str, Any]) -> list[str]:
        args = [self.value(str(arg)) for arg in spec["command"]]
        return [sys.executable, "-m", "stepledger", *args[1:]]


def _get(port: int, path: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except OSError:
        return None


@contextmanager
def _running(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Iterator[Any]:
    log = (logs / f"{name}.log").open("w")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _until_ready(name: str, port: int, process: Any, deadline: float, logs: Path) -> None:
    answer = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (logs / f"{name}.log").read_text()[-2000:]
            raise AssertionError(f"{name} exited {process.returncode}: {tail}")
        answer = _get(port, "/readyz")
        if answer == (200, "ok"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never ready: last /readyz answer {answer}")


def _healthcheck(spec: Mapping[str, Any], env: dict[str, str]) -> list[str]:
    """The service's healthcheck as a command here (CMD form; its ``python`` is ours)."""
    test = spec["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return [sys.executable if arg == "python" else arg for arg in test[1:]]


def test_every_stepledger_service_starts_healthy_from_the_compose_file(
    bootstrap: str, tmp_path: Path
) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = stepledger_services(compose)
    jobs = one_shots(services)
    assert jobs == ["init"], jobs
    daemons = sorted(set(services) - set(jobs))
    assert {"projector", "recovery"} <= set(daemons), daemons
    local = Local(bootstrap, tmp_path / "data", unique("compose-events"))
    local.data.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    deadline = time.monotonic() + BUDGET_S

    for job in jobs:
        spec = services[job]
        local.publish(spec)
        done = subprocess.run(
            local.command(spec),
            env=local.environment(spec),
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        assert done.returncode == 0, done.stderr[-2000:]

    with ExitStack() as stack:
        started = {}
        for name in daemons:
            spec = services[name]
            ports = local.publish(spec)
            argv, env = local.command(spec), local.environment(spec)
            # The published port is the daemon's probe port: --metrics-port names it.
            (port,) = ports.values()
            assert argv[argv.index("--metrics-port") + 1] == str(port), argv
            process = stack.enter_context(_running(name, argv, env, logs))
            started[name] = (spec, env, port, process)
        for name, (spec, env, port, process) in started.items():
            _until_ready(name, port, process, deadline, logs)
            assert _get(port, "/healthz") == (200, "ok"), name
            check = subprocess.run(_healthcheck(spec, env), env=env, timeout=10)
            assert check.returncode == 0, f"{name}'s compose healthcheck failed"
    # The default recovery runs with no registry, and said so once (then stopped cleanly).
    recovery_log = (logs / "recovery.log").read_text()
    assert recovery_log.count(NO_TOOLS_NOTICE) == 1, recovery_log[-2000:]


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${STEPLEDGER_TOOLS:-none}", {}, "none"),
        ("${STEPLEDGER_TOOLS:-none}", {"STEPLEDGER_TOOLS": "a.b:c"}, "a.b:c"),
        ("${X}", {}, ""),
        ("a$$b", {}, "a$b"),
    ],
)
def test_interpolation_as_compose_does_it(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected

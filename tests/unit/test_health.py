"""The probes every daemon serves beside its metrics: /healthz, /readyz, and a busy port."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from stepledger.daemon.health import Health, partitions_unready, serve_probes
from stepledger.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 1.0

    def __call__(self) -> float:
        return self.now


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_starting_is_alive_but_not_ready_until_reported() -> None:
    clock = Clock()
    health = Health("the projector", clock=clock)
    assert health.alive() is None
    assert health.unready() == "the projector is starting"
    health.report(None)
    assert health.unready() is None
    health.report("behind")
    assert health.unready() == "behind"


def test_a_loop_that_stops_beating_is_neither_alive_nor_ready() -> None:
    clock = Clock()
    health = Health("recovery", clock=clock, stale_after_s=10)
    health.report(None)
    clock.now += 11
    assert health.alive() == "recovery's loop has not gone round for 11s"
    assert health.unready() == health.alive()
    health.beat()
    assert health.alive() is None and health.unready() is None


def test_readiness_needs_a_group_every_partition_placed_and_near_its_end() -> None:
    def unready(**kw: object) -> str | None:
        args: dict[str, object] = {"joined": True, "behind": {"t[0]": 0}} | kw
        return partitions_unready("p", **args)  # type: ignore[arg-type]

    assert unready() is None
    assert unready(joined=False) == "p has no partitions assigned yet"
    assert unready(broker_up=False) == "p cannot reach the broker"
    assert unready(held=2) == "p holds 2 partitions back (a previous owner still has them)"
    assert unready(behind={"t[0]": None}) == "p has not read t[0] to its end yet"
    assert unready(behind={"t[0]": 10}, bound=10) is None
    assert unready(behind={"t[1]": 11}, bound=10) == (
        "p is 11 records behind the end of t[1] (ready within 10)"
    )
    assert unready(behind={}) is None  # a member with no partitions serves nothing late


def test_probes_answer_over_http_beside_the_metrics() -> None:
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("stepledger_probe_test", "A counter.", registry=registry).inc()
    checked: list[str | None] = ["queue unreadable"]
    health = Health("the inbox", check=lambda: checked[0])
    server = serve_probes(0, health, registry)
    assert server is not None
    try:
        port = int(server.server_address[1])
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (503, "queue unreadable\n")
        checked[0] = None
        assert _get(port, "/readyz") == (200, "ok\n")
        status, body = _get(port, "/metrics")
        assert status == 200 and "stepledger_probe_test_total 1.0" in body
    finally:
        server.shutdown()
        server.server_close()


def test_without_a_registry_only_the_probes_are_served() -> None:
    server = serve_probes(0, Health("the checkpointer"))
    assert server is not None
    try:
        port = int(server.server_address[1])
        assert _get(port, "/metrics")[0] == 404
        assert _get(port, "/readyz") == (503, "the checkpointer is starting\n")
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_port_is_one_line(busy_port: int) -> None:
    with pytest.raises(ConfigError) as raised:
        serve_probes(busy_port, Health("x"))
    assert raised.value.message == (
        f"--metrics-port {busy_port}: cannot listen on 127.0.0.1:{busy_port}: "
        "Address already in use"
    )
    assert serve_probes(None, Health("x")) is None

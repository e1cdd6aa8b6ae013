"""The example tools' hooks against the real loopback services, and registry loading."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.domain import ids
from stepledger.domain.tools import Found, NotFound
from stepledger.errors import ToolRegistryError, ToolServiceError
from stepledger.resolution.registry import ToolRegistry, load_registries, load_registry
from stepledger_dev.broker import free_port
from stepledger_dev.examples import tools as ex
from stepledger_dev.examples.clients import RunningService, _JsonClient, start_service

CHARGE = {"amount": 300, "currency": "EUR", "customer": "cus_9"}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningService]]:
    base = tmp_path_factory.mktemp("tools")
    running = {
        kind: start_service(kind, base / f"{kind}.sqlite")
        for kind in ("payments", "bookings", "email")
    }
    yield running
    for service in running.values():
        service.stop()


@pytest.fixture(scope="module")
def registry(services: dict[str, RunningService]) -> ToolRegistry:
    urls = {k: s.url for k, s in services.items()}
    return ex.make_registry(urls["payments"], urls["bookings"], urls["email"], timeout_s=2.0)


def test_payments_query_finds_the_charge_by_key(registry: ToolRegistry) -> None:
    tool = registry.require(ex.PAYMENTS)
    assert tool.query is not None and tool.run is not None and tool.redrive is not None
    key = ids.idempotency_key("wf-tools", "charge", ex.PAYMENTS)
    assert isinstance(tool.query(CHARGE, key), NotFound)
    charged = tool.run(CHARGE, key)
    found = tool.query(CHARGE, key)
    assert isinstance(found, Found) and found.result["charge_id"] == charged["charge_id"]
    replay = tool.redrive(CHARGE, key)
    assert replay["replayed"] is True and replay["charge_id"] == charged["charge_id"]


def test_bookings_compensation_undoes_once_and_tolerates_nothing_to_undo(
    registry: ToolRegistry, services: dict[str, RunningService]
) -> None:
    tool = registry.require(ex.BOOKINGS)
    assert tool.compensate is not None and tool.run is not None
    never = ids.idempotency_key("wf-tools", "never", ex.BOOKINGS)
    assert isinstance(tool.compensate({}, never, None), NotFound)
    key = ids.idempotency_key("wf-tools", "book", ex.BOOKINGS)
    tool.run({"hotel": "H", "nights": 1}, key)
    assert tool.compensate({}, key, None)["status"] == "cancelled"
    assert tool.compensate({}, key, None)["status"] == "already_cancelled"
    assert _JsonClient(services["bookings"].url).effect_count("cancel", key) == 1


def test_service_errors_become_tool_service_errors(registry: ToolRegistry) -> None:
    tool = registry.require(ex.PAYMENTS)
    assert tool.run is not None
    key = ids.idempotency_key("wf-tools", "conflict", ex.PAYMENTS)
    tool.run(CHARGE, key)
    with pytest.raises(ToolServiceError) as refused:
        tool.run({**CHARGE, "amount": 999}, key)
    assert refused.value.status == 409 and not refused.value.retryable
    dead = ex.payments_tool(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    assert dead.query is not None
    with pytest.raises(ToolServiceError) as unreachable:
        dead.query(CHARGE, key)
    assert unreachable.value.retryable and unreachable.value.status is None


def test_registry_from_environment_keeps_only_configured_services() -> None:
    only = ex.registry(
        {"STEPLEDGER_EMAIL_URL": "http://127.0.0.1:9", "STEPLEDGER_TOOL_TIMEOUT_S": "3"}
    )
    assert only.names() == [ex.EMAIL] and only.require(ex.EMAIL).timeout_s == 3.0
    with pytest.raises(ToolRegistryError, match="STEPLEDGER_PAYMENTS_URL"):
        ex.registry({})
    with pytest.raises(ToolRegistryError, match="invalid example tool limit"):
        ex.registry({"STEPLEDGER_EMAIL_URL": "http://x:1", "STEPLEDGER_TOOL_MAX_ATTEMPTS": "many"})


def test_load_registry_by_import_path_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPLEDGER_PAYMENTS_URL", "http://127.0.0.1:9")
    loaded = load_registry("stepledger_dev.examples.tools:registry")
    assert loaded.names() == [ex.CAPTURE, ex.PAYMENTS], "the charge with and without refund"
    merged = load_registries(["stepledger_dev.examples.tools:registry"], entry_points_too=False)
    assert ex.PAYMENTS in merged
    for spec, message in [
        ("no_colon", "expected --tools"),
        ("stepledger.nope:registry", "cannot import"),
        ("stepledger_dev.examples.tools:nope", "has no attribute"),
        ("stepledger_dev.examples.tools:PAYMENTS", "is not a ToolRegistry"),
    ]:
        with pytest.raises(ToolRegistryError, match=message):
            load_registry(spec)
    with pytest.raises(ToolRegistryError, match="registered twice"):
        ToolRegistry([ex.email_tool("http://a:1"), ex.email_tool("http://b:1")])


def test_a_missing_tool_names_the_known_ones(tmp_path: Path) -> None:
    tools = ToolRegistry([ex.email_tool("http://127.0.0.1:9")])
    with pytest.raises(ToolRegistryError, match=r"known: email\.send"):
        tools.require("payments.charge")

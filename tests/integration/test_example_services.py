"""Integration tests for the example tool services, run as real loopback subprocesses."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stepledger_dev.examples.clients import (
    BookingsClient,
    EmailClient,
    PaymentsClient,
    RunningService,
    ServiceError,
    start_service,
)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `condition` until it holds, failing the test at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)


@pytest.fixture
def payments_service(tmp_path: Path) -> Iterator[RunningService]:
    with start_service("payments", tmp_path / "payments.sqlite") as service:
        yield service


@pytest.fixture
def payments(payments_service: RunningService) -> PaymentsClient:
    return PaymentsClient(payments_service.url, timeout=5.0)


@pytest.fixture
def bookings(tmp_path: Path) -> Iterator[BookingsClient]:
    with start_service("bookings", tmp_path / "bookings.sqlite") as service:
        yield BookingsClient(service.url, timeout=5.0)


@pytest.fixture
def email(tmp_path: Path) -> Iterator[EmailClient]:
    with start_service("email", tmp_path / "email.sqlite") as service:
        yield EmailClient(service.url, timeout=5.0)


def test_service_binds_loopback_and_reports_health(payments_service: RunningService) -> None:
    assert payments_service.url.startswith("http://127.0.0.1:")
    assert PaymentsClient(payments_service.url).health()
    assert "listening on " + payments_service.url in payments_service.log()


def test_keyed_replay_does_not_add_effect(payments: PaymentsClient) -> None:
    first = payments.charge("order-1", 1200, "EUR", "cus_1")
    second = payments.charge("order-1", 1200, "EUR", "cus_1")
    assert first["replayed"] is False
    assert second["replayed"] is True
    assert second["charge_id"] == first["charge_id"]
    assert first["status"] == "captured"
    assert payments.effect_count("charge") == 1
    assert payments.effects()["by_key"] == {"order-1": 1}


def test_concurrent_calls_with_one_key_make_one_effect(payments: PaymentsClient) -> None:
    def charge(_: int) -> str:
        return str(payments.charge("order-1", 1200, "EUR", "cus_1")["charge_id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        charge_ids = set(pool.map(charge, range(16)))
    assert len(charge_ids) == 1
    assert payments.effect_count("charge") == 1


def test_key_reuse_with_different_amount_is_409(payments: PaymentsClient) -> None:
    payments.charge("order-1", 1200, "EUR", "cus_1")
    with pytest.raises(ServiceError) as caught:
        payments.charge("order-1", 9999, "EUR", "cus_1")
    assert caught.value.status == 409
    assert caught.value.body["error"] == "idempotency_conflict"
    assert payments.effect_count("charge") == 1


def test_bad_request_is_400_without_effect(payments: PaymentsClient) -> None:
    with pytest.raises(ServiceError) as caught:
        payments.charge("order-1", -5, "EUR", "cus_1")
    assert caught.value.status == 400
    assert payments.effect_count("charge") == 0


def test_lookup_by_key_found_and_not_found(payments: PaymentsClient) -> None:
    assert payments.find_charge("order/with spaces?") is None
    charge = payments.charge("order/with spaces?", 500, "USD", "cus_2")
    found = payments.find_charge("order/with spaces?")
    assert found is not None
    assert found["charge_id"] == charge["charge_id"]
    assert found["amount"] == 500


def test_booking_lookup_by_key(bookings: BookingsClient) -> None:
    assert bookings.find_booking("trip-1") is None
    booking = bookings.book("trip-1", "Hotel Adlon", 2)
    assert booking["status"] == "confirmed"
    found = bookings.find_booking("trip-1")
    assert found is not None and found["booking_id"] == booking["booking_id"]
    assert bookings.book("trip-1", "Hotel Adlon", 2)["replayed"] is True
    assert bookings.effect_count("booking") == 1


def test_refund_of_unknown_charge_is_nothing_to_undo(payments: PaymentsClient) -> None:
    assert payments.refund("refund-1", "never-charged")["status"] == "nothing_to_undo"
    assert payments.effect_count("refund") == 0


def test_a_charge_arriving_after_its_refund_found_nothing_is_refused(
    payments: PaymentsClient,
) -> None:
    # A zombie call: recovery refunded first (nothing yet), then the charge arrives.
    assert payments.refund("refund-1", "late-order")["status"] == "nothing_to_undo"
    with pytest.raises(ServiceError) as refused:
        payments.charge("late-order", 1200, "EUR", "cus_1")
    assert refused.value.status == 409 and refused.value.body["error"] == "voided"
    assert payments.effect_count("charge") == 0
    assert payments.find_charge("late-order") is None
    assert payments.charge("other-order", 1200, "EUR", "cus_1")["replayed"] is False


def test_refund_twice_with_same_key_is_a_replay(payments: PaymentsClient) -> None:
    payments.charge("order-1", 1200, "EUR", "cus_1")
    first = payments.refund("refund-1", "order-1")
    second = payments.refund("refund-1", "order-1")
    assert first["status"] == "refunded" and first["replayed"] is False
    assert second["replayed"] is True and second["refund_id"] == first["refund_id"]
    assert payments.refund("refund-2", "order-1")["status"] == "already_refunded"
    assert payments.effect_count("refund") == 1
    charge = payments.find_charge("order-1")
    assert charge is not None and charge["status"] == "refunded"


def test_cancel_of_unknown_booking_is_nothing_to_undo(bookings: BookingsClient) -> None:
    assert bookings.cancel("never-booked")["status"] == "nothing_to_undo"
    assert bookings.effect_count("cancel") == 0


def test_a_booking_arriving_after_its_cancel_found_nothing_is_refused(
    bookings: BookingsClient,
) -> None:
    assert bookings.cancel("late-trip")["status"] == "nothing_to_undo"
    assert bookings.cancel("late-trip")["status"] == "nothing_to_undo"
    with pytest.raises(ServiceError) as refused:
        bookings.book("late-trip", "Hotel Adlon", 2)
    assert refused.value.status == 409 and refused.value.body["error"] == "voided"
    assert bookings.effect_count("booking") == 0
    assert bookings.find_booking("late-trip") is None


def test_a_request_ignoring_the_void_lands_as_a_service_without_memory_would(
    bookings: BookingsClient,
) -> None:
    # The fault the e2e conflict test uses: the late booking lands despite the void.
    assert bookings.cancel("late-trip")["status"] == "nothing_to_undo"
    landed = bookings.book("late-trip", "Hotel Adlon", 2, fault="ignore-void")
    assert landed["status"] == "confirmed" and landed["replayed"] is False
    assert bookings.effect_count("booking") == 1


def test_cancel_twice_is_a_noop_the_second_time(bookings: BookingsClient) -> None:
    bookings.book("trip-1", "Hotel Adlon", 2)
    assert bookings.cancel("trip-1")["status"] == "cancelled"
    assert bookings.cancel("trip-1")["status"] == "already_cancelled"
    assert bookings.effect_count("cancel") == 1
    found = bookings.find_booking("trip-1")
    assert found is not None and found["status"] == "cancelled"


def test_email_counts_every_send(email: EmailClient) -> None:
    ids = {email.send("ana@example.com", "Hi", "same body")["message_id"] for _ in range(3)}
    assert len(ids) == 3
    assert email.effect_count("email") == 3


def test_fail_after_performs_effect_and_reports_503(payments: PaymentsClient) -> None:
    with pytest.raises(ServiceError) as caught:
        payments.charge("order-1", 1200, "EUR", "cus_1", fault="fail-after")
    assert caught.value.status == 503
    assert payments.effect_count("charge", "order-1") == 1
    assert payments.find_charge("order-1") is not None
    assert payments.charge("order-1", 1200, "EUR", "cus_1")["replayed"] is True
    assert payments.effect_count("charge") == 1


def test_fail_before_has_no_effect(payments: PaymentsClient) -> None:
    with pytest.raises(ServiceError) as caught:
        payments.charge("order-1", 1200, "EUR", "cus_1", fault="fail-before")
    assert caught.value.status == 503
    assert payments.find_charge("order-1") is None
    assert payments.effect_count("charge") == 0


def test_fault_can_be_requested_by_query_parameter(payments_service: RunningService) -> None:
    payload = {"idempotency_key": "q-1", "amount": 1, "currency": "EUR", "customer": "c"}
    request = urllib.request.Request(
        payments_service.url + "/charges?fault=fail-after",
        data=json.dumps(payload).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 503
    assert PaymentsClient(payments_service.url).effect_count("charge", "q-1") == 1


def test_delayed_call_times_out_but_effect_lands_later(
    payments_service: RunningService,
) -> None:
    impatient = PaymentsClient(payments_service.url, timeout=0.3)
    with pytest.raises(TimeoutError):
        impatient.charge("order-1", 1200, "EUR", "cus_1", fault="delay=1.5")
    payments = PaymentsClient(payments_service.url)
    assert payments.effect_count("charge") == 0
    wait_until(lambda: payments.effect_count("charge") == 1)


def test_effects_survive_sigkill_and_restart(tmp_path: Path) -> None:
    state = tmp_path / "payments.sqlite"
    with start_service("payments", state) as first:
        client = PaymentsClient(first.url)
        charge = client.charge("order-1", 1200, "EUR", "cus_1")
        client.refund("refund-1", "order-1")
        assert first.kill() == -signal.SIGKILL
    with start_service("payments", state) as second:
        client = PaymentsClient(second.url)
        assert client.effects()["effects"] == {"charge": 1, "refund": 1}
        replay = client.charge("order-1", 1200, "EUR", "cus_1")
        assert replay["replayed"] is True and replay["charge_id"] == charge["charge_id"]
        assert client.effect_count("charge") == 1


def test_sigterm_stops_the_service_cleanly(tmp_path: Path) -> None:
    service = start_service("email", tmp_path / "email.sqlite")
    assert service.stop() == 0
    assert "stopped" in service.log()


def test_ignore_keys_build_doubles_effects(tmp_path: Path) -> None:
    with start_service("payments", tmp_path / "broken.sqlite", ignore_keys=True) as service:
        client = PaymentsClient(service.url)
        first = client.charge("order-1", 1200, "EUR", "cus_1")
        second = client.charge("order-1", 1200, "EUR", "cus_1")
        assert second["replayed"] is False
        assert second["charge_id"] != first["charge_id"]
        assert client.effect_count("charge", "order-1") == 2

"""The consumer adapter's group settings and error policy, without a broker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from stepledger.config import Settings
from stepledger.errors import BrokerError, ConfigError
from stepledger.kafka.consumer import GroupConsumer, Membership, consumer_failure

SETTINGS = Settings(bootstrap="127.0.0.1:9", topic="t")
FENCED = (
    "Fatal error: Broker: Static consumer fenced by other consumer with same "
    "group.instance.id: Fatal consumer error: Broker: Static consumer fenced by other consumer"
)


def test_classic_members_are_cooperative_with_their_session_and_instance_id() -> None:
    conf = Membership("g", session_timeout_s=4.0, instance_id="projector-1").config(SETTINGS)
    assert conf["group.protocol"] == "classic"
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert (conf["session.timeout.ms"], conf["heartbeat.interval.ms"]) == (4000, 400)
    assert conf["group.instance.id"] == "projector-1"
    assert GroupConsumer(SETTINGS, Membership("g")).incremental


@pytest.mark.parametrize("how", ["option", "-X"])
def test_kip848_drops_the_settings_librdkafka_refuses_under_it(how: str) -> None:
    if how == "option":
        settings, membership = SETTINGS, Membership("g", protocol="consumer")
    else:
        settings = Settings(bootstrap="127.0.0.1:9", kafka={"group.protocol": "consumer"})
        membership = Membership("g")
    conf = membership.config(settings)
    assert conf["group.protocol"] == "consumer"
    for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        assert key not in conf
    assert GroupConsumer(settings, membership).incremental


def test_extra_settings_win_and_set_the_fence_timing() -> None:
    membership = Membership("g", extra={"session.timeout.ms": 2000, "heartbeat.interval.ms": 200})
    assert membership.config(SETTINGS)["session.timeout.ms"] == 2000
    assert membership.fence_timing == (2.0, 0.2)
    assert Membership("g", session_timeout_s=6.0).fence_timing == (6.0, 0.6)


@pytest.mark.parametrize("seconds", [0.0, 0.999, 300.5, 400.0, float("inf"), float("nan")])
def test_a_session_timeout_out_of_range_is_refused_in_one_line(seconds: float) -> None:
    with pytest.raises(ConfigError, match="out of range") as caught:
        Membership("g", session_timeout_s=seconds)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("instance_id", ["", "a b", "x" * 250, "proj/1", "é"])
def test_a_bad_instance_id_is_refused(instance_id: str) -> None:
    with pytest.raises(ConfigError, match="instance id"):
        Membership("g", instance_id=instance_id)


def test_the_edges_of_the_ranges_are_accepted() -> None:
    Membership("g", session_timeout_s=1.0, instance_id="x" * 249)
    Membership("g", session_timeout_s=300.0, instance_id="a.b_c-1")


def test_a_fenced_static_member_must_stop_and_says_why_in_one_line() -> None:
    # librdkafka delivers the fence as a _FATAL event whose fatal() is False.
    err = KafkaError(KafkaError._FATAL, FENCED)
    assert not err.fatal()
    reason = consumer_failure(err, "projector-1")
    assert reason is not None and "\n" not in reason
    assert "fenced" in reason and "'projector-1'" in reason
    assert "Fatal consumer error" not in reason


def test_transient_errors_are_left_to_librdkafka() -> None:
    assert consumer_failure(KafkaError(KafkaError._TRANSPORT, "down")) is None
    refused = consumer_failure(KafkaError(KafkaError.INVALID_SESSION_TIMEOUT, "refused"))
    assert refused is not None and "--session-timeout" in refused


def test_no_client_before_subscribe() -> None:
    consumer = GroupConsumer(SETTINGS, Membership("g"))
    with pytest.raises(BrokerError, match="not subscribed"):
        consumer.poll(1, 0)
    consumer.close()

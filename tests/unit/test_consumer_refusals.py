"""A consumer-group member refused by the broker says so in one line and keeps running."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError

from stepledger.config import Settings
from stepledger.kafka import consumer as kc
from stepledger.kafka.consumer import GroupConsumer, Membership


class _Refused:
    """A client message carrying an error, as librdkafka hands a refusal to ``consume``."""

    def __init__(self, code: int, topic: str | None = None) -> None:
        self._err = KafkaError(code)
        self._topic = topic

    def error(self) -> KafkaError:
        return self._err

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 0


class _Client:
    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches = batches

    def consume(self, size: int, timeout: float) -> list[Any]:
        return self.batches.pop(0) if self.batches else []


def _member(batches: list[list[Any]]) -> GroupConsumer:
    settings = Settings(
        topic="orders",
        fleet_id="orders",
        kafka={"sasl.username": "orders.checkpointer"},
    )
    member = GroupConsumer(settings, Membership("orders.checkpointer"))
    member._client = _Client(batches)  # type: ignore[assignment]  # the client's two calls
    return member


def test_a_refused_group_is_one_line_said_once_and_the_member_runs_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = KafkaError.GROUP_AUTHORIZATION_FAILED
    member = _member([[_Refused(group)] for _ in range(5)])
    with caplog.at_level(logging.WARNING, logger=kc.logger.name):
        for _ in range(5):
            assert member.poll(10, 0.0).records == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("not authorised: User:orders.checkpointer lacks READ on GROUP ")
    assert "orders.checkpointer" in lines[0] and "\n" not in lines[0]


def test_a_refused_topic_names_the_topic(caplog: pytest.LogCaptureFixture) -> None:
    member = _member([[_Refused(KafkaError.TOPIC_AUTHORIZATION_FAILED, "other")]])
    with caplog.at_level(logging.WARNING, logger=kc.logger.name):
        assert member.poll(10, 0.0).records == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert "lacks READ on TOPIC other" in line


def test_another_error_still_goes_the_usual_way(caplog: pytest.LogCaptureFixture) -> None:
    member = _member([[_Refused(KafkaError._TRANSPORT)]])
    with caplog.at_level(logging.WARNING):
        member.poll(10, 0.0)
    assert any("retried by the client" in r.getMessage() for r in caplog.records)


def test_a_partition_reader_meets_the_same_refusal_one_line_raised_or_said() -> None:
    from stepledger.errors import NotAuthorisedError
    from stepledger.kafka.broker import Refusals
    from stepledger.kafka.records import any_error, fatal_error, polled

    settings = Settings(topic="orders", kafka={"sasl.username": "orders.agent"})
    refused = [_Refused(KafkaError.TOPIC_AUTHORIZATION_FAILED, "other")]
    refusals = Refusals(settings, "GROUP orders.reader")
    # A bounded read (a command) stops with the one line, not the client's text.
    with pytest.raises(NotAuthorisedError, match=r"lacks READ on TOPIC other$"):
        polled(refused, any_error("reading the log"), refusals)  # type: ignore[arg-type]
    # A long read (a daemon's follow) says it and reads on.
    assert polled(refused, fatal_error("following"), refusals).records == []  # type: ignore[arg-type]

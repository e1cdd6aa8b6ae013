"""A created topic is listed by the broker before `ensure_topics` returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka import broker


@dataclass
class Topic:
    partitions: dict[int, object]
    error: object = None


@dataclass
class Metadata:
    topics: dict[str, Topic]


@dataclass
class LateAdmin:
    """An admin client whose broker lists a created topic only from its ``late``-th listing
    after the create on, as Apache Kafka's brokers do under load (the controller answers the
    create first)."""

    late: int
    known: dict[str, Topic] = field(default_factory=dict)
    created: dict[str, Topic] = field(default_factory=dict)
    requests: int = 0
    after_create: int = 0

    def list_topics(self, timeout: float) -> Metadata:
        self.requests += 1
        if self.created:
            self.after_create += 1
            if self.after_create >= self.late:
                self.known.update(self.created)
        return Metadata(dict(self.known))

    def create_topics(self, new: list[Any], operation_timeout: float) -> dict[str, Any]:
        class Done:
            def result(self, timeout: float) -> None:
                return None

        for topic in new:
            self.created[topic.topic] = Topic({p: object() for p in range(topic.num_partitions)})
        return {t.topic: Done() for t in new}


SETTINGS = Settings(bootstrap="127.0.0.1:9")


def test_ensure_topics_returns_once_the_broker_lists_what_it_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = LateAdmin(late=4)
    monkeypatch.setattr(broker, "admin", lambda _settings: client)
    broker.ensure_topics(SETTINGS, ["events", "dlq"], partitions=2)
    assert set(client.known) == {"events", "dlq"}
    assert client.requests == 1 + 4  # the listing before the create, then four after it


def test_a_topic_never_listed_is_one_broker_error_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = LateAdmin(late=10**9)
    monkeypatch.setattr(broker, "admin", lambda _settings: client)
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"\['events'\] are not listed"):
        broker.ensure_topics(SETTINGS, ["events"], timeout=0.3)
    assert time.monotonic() - started < 2.0

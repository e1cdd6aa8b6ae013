"""A client librdkafka declared dead is replaced: the next record is acknowledged.

A real fatal error, on demand: with ``enable.gapless.guarantee`` a record the broker
refuses for good (larger than the topic's ``max.message.bytes``) kills the idempotent
client.  confluent-kafka raises that error from ``poll`` and never hands it to
``error_cb``, and refuses every later ``produce`` with ``_FATAL``: the durable producer
watched only ``error_cb``, so one dead client refused every record after it, for good (a
graceful restart of the dev broker on durable storage did it to a chaos run's agents).
"""

from __future__ import annotations

from typing import Any

import pytest

from stepledger.errors import DurabilityError
from stepledger.kafka import DurableProducer
from stepledger.kafka.broker import ensure_topics
from tests.conftest import Factory

LIMIT = 2_000


def test_a_client_killed_by_a_fatal_error_is_replaced_and_the_next_record_lands(
    make_settings: Factory, engine: str
) -> None:
    if engine != "kafka":
        pytest.skip("the dev broker does not enforce max.message.bytes (the Kafka pass runs it)")
    settings = make_settings(create=False)
    ensure_topics(
        settings, [settings.topic], configs={settings.topic: {"max.message.bytes": str(LIMIT)}}
    )
    gapless: dict[str, Any] = {"enable.gapless.guarantee": True}
    producer = DurableProducer(settings, **gapless)
    try:
        first = producer.append(settings.topic, b"k", b"small")
        with pytest.raises(DurabilityError, match="too large"):
            producer.append(settings.topic, b"k", b"x" * (3 * LIMIT))
        after = [producer.append(settings.topic, b"k", b"small") for _ in range(3)]
        assert [p.offset for p in after] == sorted({p.offset for p in after})
        assert after[0].offset > first.offset
    finally:
        producer.close()

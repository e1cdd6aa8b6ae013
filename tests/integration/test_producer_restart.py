"""A durable producer works again after its broker restarted (a new client if it gave up)."""

from __future__ import annotations

from pathlib import Path

from stepledger.config import Settings
from stepledger.errors import DurabilityError
from stepledger.kafka import DurableProducer, ensure_topics
from stepledger_dev.broker import LocalBroker


def test_appends_succeed_again_after_a_broker_restart_with_the_same_producer(
    tmp_path: Path,
) -> None:
    with LocalBroker(log_path=tmp_path / "broker.log") as broker:
        settings = Settings(bootstrap=broker.bootstrap, topic="t", durable_timeout_s=3.0)
        ensure_topics(settings, ["t"], partitions=1)
        producer = DurableProducer(settings)
        try:
            producer.append("t", b"k", b"before")
            broker.restart()  # memory storage: the broker comes back empty, producer ids unknown
            ensure_topics(settings, ["t"], partitions=1)
            failures = 0
            for _ in range(5):  # bounded: a record in flight at the restart may fail
                try:
                    producer.append("t", b"k", b"after")
                    break
                except DurabilityError:
                    failures += 1
            assert failures < 5, "the producer never recovered from the restart"
            producer.append("t", b"k", b"again")
        finally:
            producer.close()

"""Kafka, in one package: the only part of stepledger (with the codec's schema registry) that
imports confluent-kafka.

- :mod:`~stepledger.kafka.producer`: the durable producer (acks=all, idempotent, a future
  per record) every appender uses;
- :mod:`~stepledger.kafka.consumer`: group and assigned consumers, bounded topic reads, and
  :class:`~stepledger.kafka.consumer.Record`, the decoded record the rest of the library sees;
- :mod:`~stepledger.kafka.broker`: topics and partitions, a broker awaited at start;
- :mod:`~stepledger.kafka.watch`: one line per broker outage and recovery;
- :mod:`~stepledger.kafka.partitioner`: which partition a key lands on, as librdkafka says;
- :mod:`~stepledger.kafka.client`: the library's own types, for the modules that hold a
  partition, an offset constant or an error code (so nothing else imports the library).

The import contract ``kafka-one-package`` keeps it so.
"""

from stepledger.kafka.broker import (
    admin,
    ensure_topics,
    listed_topics,
    reachable_partitions,
    topic_id,
    topic_partitions,
)
from stepledger.kafka.producer import (
    DURABLE_PRODUCER,
    DurableProducer,
    Headers,
    Position,
    durable_config,
    position_of,
)

__all__ = [
    "DURABLE_PRODUCER",
    "DurableProducer",
    "Headers",
    "Position",
    "admin",
    "durable_config",
    "ensure_topics",
    "listed_topics",
    "position_of",
    "reachable_partitions",
    "topic_id",
    "topic_partitions",
]

"""Kafka, in one package: the only part of stepledger that imports confluent-kafka.

- :mod:`~stepledger.kafka.producer`: the durable producer (acks=all, idempotent, a future
  per record) every appender uses;
- :mod:`~stepledger.kafka.reader`: the one partition reader (fixed partitions from given
  offsets, read to their ends within a deadline or followed) and :func:`read_topic`;
- :mod:`~stepledger.kafka.consumer`: the consumer-group member the daemons read through;
- :mod:`~stepledger.kafka.records`: what both hand over: the library's own record
  (:class:`~stepledger.kafka.records.Consumed`), a partition (``Where``), a poll's answer;
- :mod:`~stepledger.kafka.broker`: topics and partitions, a broker awaited at start;
  :mod:`~stepledger.kafka.describe`: what the cluster says of its brokers, configs, groups;
- :mod:`~stepledger.kafka.watch`: one line per broker outage and recovery;
- :mod:`~stepledger.kafka.partitioner`: which partition a key lands on, as librdkafka says;
- :mod:`~stepledger.kafka.registry`: the schema registry the codec's registry framing asks.

No client type leaves the package: the import contract ``kafka-one-package`` forbids
confluent-kafka elsewhere, and ``tests/unit/test_kafka_types_stay.py`` checks that no module
outside it holds a client object or a function returning one.
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
    "reachable_partitions",
    "topic_id",
    "topic_partitions",
]

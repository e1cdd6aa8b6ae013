"""The client library's own types, for modules above this package that hold one.

A partition to assign, an offset constant, an error code to compare, a record the consumer
handed over: the modules that need one take it from here, so only :mod:`stepledger.kafka`
(and the codec's schema-registry client) imports confluent-kafka, as the import contract
``kafka-one-package`` checks.  Building clients stays in this package's other modules.
"""

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

__all__ = [
    "OFFSET_BEGINNING",
    "AdminClient",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupTopicPartitions",
    "KafkaError",
    "KafkaException",
    "Message",
    "NewTopic",
    "OffsetSpec",
    "Producer",
    "ResourceType",
    "TopicPartition",
]

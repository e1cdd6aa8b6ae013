"""Apache Kafka for development and tests: jars fetched once by Maven, a KRaft launcher.

``KafkaBroker`` parallels ``stepledger_dev.broker.LocalBroker`` (the bundled Tansu broker) but
needs Java 17+ (and Maven the first time, to fill the cache; see ``dist``).
"""

from __future__ import annotations

from stepledger_dev.apache_kafka.cluster import KafkaBroker, KafkaNode, archive_classes
from stepledger_dev.apache_kafka.dist import KAFKA_VERSION, cache_root, java_executable, kafka_libs
from stepledger_dev.apache_kafka.secure import Security

__all__ = [
    "KAFKA_VERSION",
    "KafkaBroker",
    "KafkaNode",
    "Security",
    "archive_classes",
    "cache_root",
    "java_executable",
    "kafka_libs",
]

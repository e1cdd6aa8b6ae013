"""A read to the end whose broker stops answering mid-read: each record comes once.

The partition reader grows its fetch wait by replacing its client at the position it handed
over (``Consumer.position``).  Here Apache Kafka is SIGSTOPped after part of the partition was
read, with the client's prefetch queue kept tiny so what it fetched ahead is dropped with
the replaced consumer: the read must neither skip nor repeat a record.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.kafka import DurableProducer, ensure_topics
from stepledger.kafka.reader import PartitionReader
from stepledger_dev.apache_kafka import KafkaBroker

RECORDS = 300
BEFORE_PAUSE = 40
PAUSE_S = 1.5

pytestmark = [
    pytest.mark.kafka_only,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs java for Apache Kafka"),
]


def test_a_broker_stopped_mid_read_grows_the_wait_and_no_record_is_skipped_or_repeated(
    tmp_path: Path,
) -> None:
    with KafkaBroker(nodes=1, log_dir=tmp_path / "kafka") as cluster:
        # A tiny prefetch: the consumer replaced mid-read held records it never handed over.
        small = {"queued.max.messages.kbytes": "1", "max.partition.fetch.bytes": "2048"}
        settings = Settings(bootstrap=cluster.bootstrap, topic="end", kafka=small)
        ensure_topics(settings, [settings.topic], partitions=1)
        producer = DurableProducer(settings)
        for n in range(RECORDS):
            producer.queue(settings.topic, b"k", b"%04d" % n + b"x" * 1000)
        assert producer.flush(30) == 0
        producer.close()
        node = cluster.members[0].node_id
        seen: list[int] = []
        reader = PartitionReader(settings, group="end-test", fetch_wait_ms=10)
        resume = threading.Timer(PAUSE_S, cluster.resume_node, args=(node,))
        try:
            # to_end raises if the partition's end is not reached within its limit.
            starts = {(settings.topic, 0): 0}
            for records in reader.to_end(starts, within=60, limit=5, wait_s=0.05):
                seen.extend(record.offset for record in records)
                if (
                    len(seen) >= BEFORE_PAUSE
                    and not resume.is_alive()
                    and not resume.finished.is_set()
                ):
                    cluster.pause_node(node)
                    resume.start()
        finally:
            resume.join(10)
            cluster.resume_node(node)
            reader.close()
        assert seen == list(range(RECORDS))  # none skipped, none twice
        assert reader.grown >= 1, "the broker never starved the read: the test proved nothing"

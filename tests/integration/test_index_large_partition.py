"""Opening a workflow in a large partition of one-record batches finishes, on Tansu too.

Tansu answers a fetch only once it assembled the answer, and past ~40-50k one-record
batches in a partition that takes longer than the index's old 10 ms fetch wait: every
fetch came back empty and opening a workflow failed after 120 s (``could not reach the
end ... in time``).  The index's wait now grows when a catch-up sees nothing arrive.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

import stepledger as sl
from stepledger.config import Settings
from stepledger.history.kafka import KafkaHistory
from stepledger.kafka import DURABLE_PRODUCER
from tests.conftest import Factory

RECORDS = 48_000
WRITERS = 8


def _one_record_batches(settings: Settings, records: int) -> None:
    """Each writer awaits every record before the next: each record is its own batch."""

    def write(w: int) -> None:
        producer = Producer(settings.client_config(**DURABLE_PRODUCER))
        for n in range(w, records, WRITERS):
            producer.produce(settings.topic, b"x" * 200, f"other-{n % 997}".encode(), partition=0)
            producer.flush(10)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


def test_opening_a_workflow_in_a_large_partition_finishes(
    make_settings: Factory, engine: str
) -> None:
    if engine != "tansu":
        pytest.skip("Apache Kafka answers a fetch as soon as it has data (the Tansu pass runs it)")
    settings = make_settings(partitions=1)
    _one_record_batches(settings, RECORDS)
    began = time.monotonic()
    with sl.Ledger(settings) as ledger:
        wf = ledger.workflow("new-here")
        assert wf.attempt == 1
        reader = ledger.history
        assert isinstance(reader, KafkaHistory)
        assert reader.last.tail_records == RECORDS  # the index read every record
        reopened = sl.Ledger(settings)
        try:
            assert reopened.workflow("new-here").attempt == 2  # found, resumed
        finally:
            reopened.close()
    assert time.monotonic() - began < 60

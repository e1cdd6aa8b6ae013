"""Opening a workflow in a partition written record by record: the index read vs a plain read.

A one-partition topic holds N records, each its own batch, as agents' durable writes land
(written with the SDK's producer settings, each record awaited): N = 12k and 60k (quick:
2k).  Timed, interleaved: a fresh ``Ledger`` opening a workflow whose id is not in the
partition (its index catches up on the whole partition, keys only, then the started event
is appended), against a plain consumer (librdkafka's defaults, assigned at offset 0)
reading the partition to its end.  Target: at most 1.5x the plain read.  Before: on Tansu
the index read with ``fetch.wait.max.ms=10`` took 17-27x a plain read at 12k and never
finished past ~60k.

``python -m bench.index [--quick] [--engine kafka]``
"""

from __future__ import annotations

import statistics
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import stepledger as sl
from bench.common import Row, broker, cli, fresh_settings
from stepledger.config import Settings
from stepledger.kafka import DURABLE_PRODUCER

REPEATS = 3
_LIMIT_S = 300.0


def one_by_one(settings: Settings, records: int) -> None:
    """Write records one at a time, each awaited: each is its own batch."""
    producer = Producer(settings.client_config(**DURABLE_PRODUCER))
    value = b"x" * 300
    for n in range(records):
        producer.produce(settings.topic, value, f"wf-{n % 997}".encode(), partition=0)
        producer.flush(10)


def plain_read_s(settings: Settings) -> float:
    """Seconds for a consumer with librdkafka's defaults to read the partition to its end."""
    group = f"plain-{uuid.uuid4().hex[:6]}"
    conf = {"group.id": group, "enable.partition.eof": True, "enable.auto.commit": False}
    consumer = Consumer(settings.client_config(**conf))
    began = time.perf_counter()
    consumer.assign([TopicPartition(settings.topic, 0, 0)])
    try:
        while time.perf_counter() - began < _LIMIT_S:
            for msg in consumer.consume(5000, 0.01):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    return time.perf_counter() - began
        raise AssertionError("the plain read did not reach the end")
    finally:
        consumer.close()


def open_s(settings: Settings) -> float:
    """Seconds for a fresh ledger to open a new workflow in the partition (index catch-up)."""
    began = time.perf_counter()
    with sl.Ledger(settings) as ledger:
        wf = ledger.workflow(f"new-{uuid.uuid4().hex[:6]}")
        assert wf.attempt == 1
        return time.perf_counter() - began


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Index read against plain read for each partition size."""
    sizes = (2_000,) if quick else (12_000, 60_000)
    repeats = 1 if quick else REPEATS
    rows: list[Row] = []
    with broker(bootstrap) as servers:
        for size in sizes:
            settings = fresh_settings(servers, partitions=1)
            one_by_one(settings, size)
            opens, plains = [], []
            for _ in range(repeats):
                plains.append(plain_read_s(settings))
                opens.append(open_s(settings))
            ours, plain = statistics.median(opens), statistics.median(plains)
            print(
                f"[index] {size:,} records: open {ours:.3f} s, plain read {plain:.3f} s", flush=True
            )
            rows.append(
                Row(
                    "index",
                    f"open a new workflow, partition of {size // 1000}k one-record batches "
                    "(vs a plain consumer's read)",
                    ours * 1000,
                    plain * 1000,
                    "ms",
                    "<=1.5",
                    False,
                )
            )
    return rows


if __name__ == "__main__":
    cli(run, __doc__)

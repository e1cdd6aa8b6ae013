"""Opening a checkpointed workflow whose partition's head was deleted (Apache Kafka only).

The reader's partition index starts a partition it never read at the partition's log
start, not at offset 0: below a deleted head offset 0 is out of range, and librdkafka's
reset to the earliest offset cost ~200 ms per catch-up (twice per open), which made an
open from checkpoint plus tail five times slower than reading the whole partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from stepledger.checkpoints.writer import Checkpointer
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.errors import HistoryExpiredError
from stepledger.history.kafka import KafkaHistory
from stepledger.kafka import admin, ensure_topics
from stepledger.kafka.topics import checkpoint_topic_config
from stepledger.producer import Ledger
from tests.conftest import unique

PAY = Tool(name="pay", keyed=True)


def _never(args: dict[str, Any], key: str) -> str:
    raise AssertionError("a recorded step must not run again")


def delete_head(settings: Settings) -> int:
    """Delete every record of partition 0; the new log start."""
    probe = Consumer(settings.client_config(**{"group.id": unique("probe")}))
    try:
        _, high = probe.get_watermark_offsets(TopicPartition(settings.topic, 0), 5.0)
    finally:
        probe.close()
    client = admin(settings)
    futures = client.delete_records([TopicPartition(settings.topic, 0, high)])
    for future in futures.values():
        assert future.result(10).low_watermark == high
    return int(high)


@pytest.mark.kafka_only
def test_an_open_below_a_deleted_head_reads_from_the_log_start_without_an_offset_reset(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(partitions=1)
    topic = settings.checkpoint_topic
    ensure_topics(settings, [topic], partitions=1, configs={topic: checkpoint_topic_config()})
    with Ledger(settings) as ledger:
        wf = ledger.start("wf-paid")
        assert wf.step("pay", PAY, {"n": 1}, lambda a, k: "paid") == "paid"
        for _ in range(20):
            ledger.start(unique("other"))
    checkpointer = Checkpointer(settings)
    try:
        checkpointer.catch_up(timeout_s=60)
    finally:
        checkpointer.close()
    start = delete_head(settings)
    with Ledger(settings) as ledger:
        ledger.start(unique("after"))  # the tail after the checkpoints

    caplog.set_level(logging.INFO, logger="stepledger.librdkafka")
    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-paid")
        assert wf.attempt == 2
        assert wf.step("pay", PAY, {"n": 1}, _never) == "paid"
        reader = ledger.history
        assert isinstance(reader, KafkaHistory)
        indexed = reader.index.records
    resets = [r.getMessage() for r in caplog.records if "out of range" in r.getMessage().lower()]
    assert resets == [], resets
    assert start > 0 and indexed <= 3  # only the tail: 'after', the claim


@pytest.mark.kafka_only
def test_a_head_deleted_after_the_index_read_it_from_0_loses_nothing_the_index_saw(
    make_settings: Callable[..., Settings],
) -> None:
    """The index began at offset 0: a deletion since then takes nothing from what it kept.

    A reader that began after the deletion cannot say that, and with no checkpoint it
    refuses to treat the workflow as new (the guard asks the broker).
    """
    settings = make_settings(partitions=1)
    with Ledger(settings) as ledger:
        wf = ledger.start("wf-before")
        assert wf.step("pay", PAY, {"n": 1}, lambda a, k: "paid") == "paid"
        indexed = ledger.workflow("wf-before")  # the index reads the partition from 0
        assert indexed.attempt == 2
        delete_head(settings)
        after = ledger.workflow("wf-before")  # from the index's memory: all of it
        assert after.attempt == 3
        assert after.step("pay", PAY, {"n": 1}, _never) == "paid"
    with Ledger(settings) as ledger, pytest.raises(HistoryExpiredError):
        ledger.workflow("wf-before")  # began past the deleted head: never run as new

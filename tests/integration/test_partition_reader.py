"""Opening a workflow reads its own partition: computed as the producer computes it, checked here.

The computed partition is compared with where the broker actually put each record, for
librdkafka's default partitioner and for murmur2 (the Java client's), on a topic with
several partitions; then a workflow is opened with the default reader and only its
partition is scanned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.history.kafka import KafkaHistory
from stepledger.kafka.partitioner import partition_of
from stepledger.kafka.reader import read_topic
from stepledger.producer import Ledger

PAY = Tool(name="pay", keyed=True)


@pytest.mark.parametrize("partitioner", [None, "murmur2_random", "consistent"])
def test_the_computed_partition_is_where_the_records_land(
    make_settings: Callable[..., Settings], partitioner: str | None
) -> None:
    kafka = {} if partitioner is None else {"partitioner": partitioner}
    settings = make_settings(partitions=7, kafka=kafka)
    ids = [f"wf-{n}-{'x' * (n % 5)}" for n in range(40)]
    with Ledger(settings) as ledger:
        for workflow_id in ids:
            ledger.start(workflow_id)
    landed: dict[str, set[int]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3):
        assert record.event is not None
        landed.setdefault(record.event.workflow_id, set()).add(record.position.partition)
    assert len({p for ps in landed.values() for p in ps}) > 3, "the keys spread out"
    name = partitioner or "consistent_random"
    for workflow_id in ids:
        assert landed[workflow_id] == {partition_of(workflow_id.encode(), 7, name)}


def test_opening_a_workflow_scans_only_its_partition(make_settings: Callable[..., Any]) -> None:
    settings = make_settings(partitions=5)
    with Ledger(settings) as ledger:
        for n in range(50):
            wf = ledger.start(f"other-{n}")
            wf.step("pay", PAY, {"n": n}, lambda a, k: 1)
        target = ledger.workflow("target")
        target.step("pay", PAY, {"n": 0}, lambda a, k: "paid")
    reader = KafkaHistory(settings)
    with Ledger(settings, reader=reader) as ledger:
        wf = ledger.workflow("target")
        assert wf.step("pay", PAY, {"n": 0}, lambda a, k: "again") == "paid"
    total = 50 * 3 + 3
    assert 0 < reader.last.tail_records < total / 2, reader.last
    # The last read is the one after the resume's claim: the start, intent, outcome and claim.
    assert reader.last.tail_events == 4

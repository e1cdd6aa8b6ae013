"""What the projector reads a backlog from: the client's cached end of each partition.

The projector stretches its snapshot interval while at least a batch waits beyond what it
read, judged from ``GroupConsumer.high_watermark`` (the end cached from fetches, no request
of its own) and cleared by the end-of-partition report.  Both are the broker's and the
client's behaviour, so they are checked here on a real broker.
"""

from __future__ import annotations

import time
import uuid

from stepledger.config import Settings
from stepledger.kafka.consumer import GroupConsumer, Membership, Placement
from stepledger.kafka.records import Where
from tests.integration.projector_helpers import produce_raw

RECORDS = 300
BATCH = 50


def test_the_cached_end_shows_what_waits_and_the_end_report_comes_once_all_is_read(
    settings: Settings,
) -> None:
    produce_raw(settings, [(b"one-key", b"v%d" % i, []) for i in range(RECORDS)])
    consumer = GroupConsumer(settings, Membership(f"backlog-{uuid.uuid4().hex[:8]}"))

    def from_the_start(partitions: list[Where]) -> Placement:
        return Placement({})  # every partition from its beginning

    consumer.subscribe([settings.topic], on_assign=from_the_start, on_revoke=lambda _: None)
    read: dict[int, int] = {}
    waiting: list[int] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            polled = consumer.poll(BATCH, 0.2)
            assert len(polled.records) <= BATCH
            for record in polled.records:
                read[record.partition] = record.offset + 1
            if polled.records:
                (partition,) = {r.partition for r in polled.records}
                high = consumer.high_watermark((settings.topic, partition))
                assert high == RECORDS, "the cached end is not the partition's end"
                waiting.append(high - read[partition])
            ended.update(p for topic, p in polled.at_end if p in read)
            if read and set(read) <= ended and sum(read.values()) == RECORDS:
                break
    finally:
        consumer.close()
    assert sum(read.values()) == RECORDS and set(read) <= ended, (read, ended)
    # While reading, what waited was seen (at least a batch after the first poll) and went
    # down to nothing as the records were read.
    assert waiting[0] >= BATCH and waiting[-1] == 0
    assert waiting == sorted(waiting, reverse=True)

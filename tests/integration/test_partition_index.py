"""The partition index behind the default reader: fresh, incremental, shared, bounded.

- A workflow another process wrote before the read is found, with all its events; an id
  not in the log has none; a workflow written after a read is found by the next read.
- A second read reads only the records written since the first (keys only).
- Eight threads opening workflows at once all see the right events, sharing catch-ups.
- Past its key bound a partition falls back to full reads and stays correct.
- Under a steady stream of writes from another process, every record acknowledged before a
  lookup is found by it, and catch-ups end at the fetched watermark instead of chasing the
  stream to an end-of-partition event.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.history.index import PartitionIndex
from stepledger.history.kafka import KafkaHistory
from stepledger.producer import Ledger

PAY = Tool(name="pay", keyed=True)

WRITER = """
import sys
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.producer import Ledger
bootstrap, topic, workflow_id = sys.argv[1:4]
with Ledger(Settings(bootstrap=bootstrap, topic=topic, producer_id="other")) as ledger:
    wf = ledger.start(workflow_id)
    wf.step("pay", Tool(name="pay", keyed=True), {"n": 1}, lambda a, k: "paid")
"""


STREAM = """
import sys
from confluent_kafka import Producer
bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
acked = []
for n in range(count):
    done = lambda err, msg: acked.append((err, msg))
    producer.produce(topic, b"v", key=b"s-%d" % n, partition=0, on_delivery=done)
    producer.flush(10)
    err, msg = acked.pop()
    if err is not None:
        sys.exit(f"not acknowledged: {err}")
    print(msg.key().decode(), flush=True)  # acknowledged: a lookup from now on must find it
"""


def write_elsewhere(settings: Settings, workflow_id: str, env: dict[str, str]) -> None:
    """Another process records a workflow (started, intent, outcome) and exits."""
    argv = [sys.executable, "-c", WRITER, settings.bootstrap, settings.topic, workflow_id]
    subprocess.run(argv, check=True, env=env, timeout=60, capture_output=True)


def fill(settings: Settings, workflows: int, prefix: str) -> None:
    with Ledger(settings) as ledger:
        for n in range(workflows):
            ledger.start(f"{prefix}-{n}").step("pay", PAY, {"n": n}, lambda a, k: a["n"])


def test_reads_see_what_was_written_before_them_and_nothing_else(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    settings = make_settings(partitions=3)
    fill(settings, 20, "old")
    reader = KafkaHistory(settings)
    try:
        assert reader.read("nobody").events == []
        write_elsewhere(settings, "late", src_env)  # after the index caught up once
        events = reader.read("late").events
        assert [e.type for e in events] == ["workflow_started", "step_intended", "step_outcome"]
        assert reader.read("old-7").events[0].type == "workflow_started"
        assert reader.read("nobody").events == []
    finally:
        reader.close()


def test_a_cold_read_is_one_pass_and_a_later_one_reads_what_it_lacks(
    make_settings: Callable[..., Any],
) -> None:
    settings = make_settings(partitions=1)
    fill(settings, 10, "c")  # 30 records
    reader = KafkaHistory(settings)
    try:
        assert [e.step_id for e in reader.read("c-4").events] == [None, "pay", "pay"]
        assert reader.last.tail_records == 30  # the index's pass: no second read
        fill(settings, 2, "d")
        assert len(reader.read("c-4").events) == 3  # unfinished: the index kept its records
        assert reader.last.tail_records == 6  # the catch-up only, no second read
        assert [e.type for e in reader.read("d-1").events][-1] == "step_outcome"
    finally:
        reader.close()


def test_a_finished_workflow_the_index_passed_is_read_from_its_first_record(
    make_settings: Callable[..., Any],
) -> None:
    settings = make_settings(partitions=1)
    fill(settings, 10, "c")  # 30 records, unfinished workflows
    with Ledger(settings) as ledger:
        ledger.start("done").finish()  # 2 records: its values are not kept
    reader = KafkaHistory(settings)
    try:
        assert reader.read("nobody").events == []  # the index reads all 32
        for n in range(20):  # other workflows opened after: each found without a scan
            assert len(reader.read(f"c-{n % 10}").events) == 3
            assert reader.last.tail_records == 0
        assert [e.type for e in reader.read("done").events] == [
            "workflow_started",
            "workflow_finished",
        ]
        assert reader.last.tail_records == 2  # from its first record to the end
    finally:
        reader.close()


def test_a_second_read_reads_only_the_new_records(make_settings: Callable[..., Any]) -> None:
    settings = make_settings(partitions=1)
    fill(settings, 30, "a")  # 90 records
    index = PartitionIndex(settings)
    partition = (settings.topic, 0)
    assert index.first_offset(partition, b"a-0") == 0
    assert index.records == 90
    fill(settings, 5, "b")  # 15 more
    assert index.first_offset(partition, b"b-0") == 90
    assert index.first_offset(partition, b"missing") is None
    assert index.records == 105  # the first 90 were not read again


def test_concurrent_opens_share_catch_ups_and_see_their_own_workflows(
    make_settings: Callable[..., Any],
) -> None:
    settings = make_settings(partitions=3)
    fill(settings, 10, "seed")
    errors: list[BaseException] = []
    with Ledger(settings) as ledger:

        def agent(n: int) -> None:
            try:
                for w in range(5):
                    wf = ledger.workflow(f"t-{n}-{w}")
                    assert wf.attempt == 1 and not wf.state.steps
                    wf.step("pay", PAY, {"n": n}, lambda a, k: a["n"])
                    wf.finish()
                again = ledger.workflow(f"t-{n}-0")  # finished: replays, runs nothing
                assert again.step("pay", PAY, {"n": n}, lambda a, k: -1) == n
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        index = ledger.history.index  # type: ignore[attr-defined]
    assert errors == []
    # 48 opens; each catch-up reads only what is new, so far fewer than 48 full reads.
    assert index.records < 10 * 3 + 48 * 4 + 8 * 3


def test_past_its_key_bound_a_partition_falls_back_to_full_reads(
    make_settings: Callable[..., Any],
) -> None:
    settings = make_settings(partitions=1)
    fill(settings, 12, "k")
    index = PartitionIndex(settings, max_keys=5)
    partition = (settings.topic, 0)
    assert index.first_offset(partition, b"k-11") == 0  # unindexed: read from the start
    assert index.first_offset(partition, b"nobody") == 0
    reader = KafkaHistory(settings)
    reader.index = index
    try:
        assert reader.read("k-11").events[0].type == "workflow_started"
        assert reader.read("nobody").events == []
    finally:
        reader.close()


def test_an_open_over_a_partition_indexed_from_offset_0_asks_no_log_start(
    make_settings: Callable[..., Settings], monkeypatch: Any
) -> None:
    """Retention's guard costs nothing while the index has read the partition from 0."""
    from stepledger.kafka.gaps import LogStart

    asked: list[tuple[str, int]] = []
    real = LogStart.of

    def counted(self: LogStart, topic: str, partition: int) -> int:
        asked.append((topic, partition))
        return real(self, topic, partition)

    monkeypatch.setattr(LogStart, "of", counted)
    settings = make_settings(partitions=1)
    with Ledger(settings) as ledger:
        wf = ledger.workflow("wf-kept")
        assert wf.step("pay", PAY, {"n": 1}, lambda a, k: "paid") == "paid"
    with Ledger(settings) as ledger:
        again = ledger.workflow("wf-kept")  # known: its records from the index's memory
        assert again.attempt == 2
        assert again.step("pay", PAY, {"n": 1}, lambda a, k: "twice") == "paid"
        assert ledger.workflow("wf-never-seen").attempt == 1  # new: proven by the index
    assert asked == [], "an open asked the broker for the log start"


def test_under_a_steady_stream_every_acknowledged_record_is_found(
    make_settings: Callable[..., Settings], src_env: dict[str, str]
) -> None:
    """A catch-up ends early at the watermark, never before a record acknowledged earlier."""
    settings = make_settings(partitions=1)
    argv = [sys.executable, "-c", STREAM, settings.bootstrap, settings.topic, "3000"]
    writer = subprocess.Popen(argv, env=src_env, stdout=subprocess.PIPE, text=True)
    acked: list[str] = []
    first = threading.Event()

    def read_acks() -> None:
        for line in writer.stdout or ():
            acked.append(line.strip())
            first.set()

    reading = threading.Thread(target=read_acks)
    reading.start()
    index = PartitionIndex(settings)
    partition = (settings.topic, 0)
    looked = 0
    try:
        assert first.wait(60), "the writer acknowledged nothing"
        while writer.poll() is None and looked < 300:
            key = acked[-1]  # acknowledged before this lookup began
            assert index.first_offset(partition, key.encode()) is not None, key
            looked += 1
    finally:
        writer.kill()
        writer.wait(30)
        reading.join(30)
        index.close()
    assert looked >= 20, f"only {looked} lookups while the writer wrote"
    assert index.watermark_ends > 0, "every catch-up waited for the end-of-partition event"

"""A fresh reader finds one checkpoint through the partition's directory, never wrongly.

Real broker, real checkpointer: every lookup through the directory must equal what reading
the whole checkpoint partition says (the checkpoint and the progress), and whatever the
directory cannot prove (a record written without the header, a checkpoint written after
the root, records deleted under it) must give the whole read's answer too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.record import WorkflowCheckpoint, encode
from stepledger.checkpoints.view import CheckpointView, Covering
from stepledger.checkpoints.writer import Checkpointer
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, WorkflowStatus
from stepledger.domain.tools import Tool
from stepledger.kafka import DurableProducer, admin, ensure_topics
from stepledger.kafka.gaps import LogStart
from stepledger.kafka.logid import resolve
from stepledger.kafka.producer import Headers
from stepledger.kafka.topics import checkpoint_topic_config
from stepledger.producer import Ledger

CHARGE = Tool(name="charge", effect="idempotent")
WORKFLOWS = 60


def log_with_checkpoints(
    make_settings: Callable[..., Settings], *, deletable: bool = False
) -> Settings:
    """One partition holding ``WORKFLOWS`` workflows (every third unfinished), checkpointed.

    ``deletable``: the checkpoint topic also allows DeleteRecords (Kafka refuses it on a
    compact-only topic), to take records from under the directory as compaction would.
    """
    settings = make_settings(partitions=1)
    config = checkpoint_topic_config()
    if deletable:
        config = {**config, "cleanup.policy": "compact,delete", "retention.ms": "-1"}
    ensure_topics(
        settings,
        [settings.checkpoint_topic],
        partitions=1,
        configs={settings.checkpoint_topic: config},
    )
    with Ledger(settings) as ledger:
        factory, log = ledger.events, ledger.log
        for i in range(WORKFLOWS):
            wf = f"wf-{i}"
            log.append(
                factory.workflow_started(wf, name="t", attempt=1, read_only=False, max_attempts=5)
            )
            for s in range(i % 4 + 1):
                log.append(factory.intent(wf, f"s{s}", CHARGE, {"n": s}, sequence=s))
                done = OutcomeStatus.SUCCEEDED
                log.append(factory.outcome(wf, f"s{s}", attempt=1, status=done, result=s))
            if i % 3:
                body = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED)
                log.append(factory.envelope(wf, None, body))
    checkpointer = Checkpointer(settings)
    try:
        checkpointer.catch_up(timeout_s=60)
    finally:
        checkpointer.close()
    return settings


def directory_answers(monkeypatch: pytest.MonkeyPatch) -> list[Covering | None]:
    """Every answer the directory gives (None: it proved nothing, the partition was read)."""
    answers: list[Covering | None] = []
    original = CheckpointView._from_directory

    def spy(self: CheckpointView, partition: int, key: bytes) -> Covering | None:
        found = original(self, partition, key)
        answers.append(found)
        return found

    monkeypatch.setattr(CheckpointView, "_from_directory", spy)
    return answers


def fast_and_whole(settings: Settings, workflow_id: str) -> tuple[Covering, Covering]:
    """A fresh view's lookup (directory first) and a whole read's."""
    fast = CheckpointView(settings).lookup(0, workflow_id, fresh=False)
    whole = CheckpointView(settings).lookup(0, workflow_id, fresh=True)
    return fast, whole


def test_every_workflow_is_found_through_the_directory_as_a_whole_read_finds_it(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirs, "CHUNK_ENTRIES", 8)  # 60 workflows: 8 buckets, 8 chunks
    settings = log_with_checkpoints(make_settings)
    answers = directory_answers(monkeypatch)
    for wf in [f"wf-{i}" for i in range(WORKFLOWS)] + ["never-seen"]:
        fast, whole = fast_and_whole(settings, wf)
        assert fast == whole, wf
        assert whole.progress is not None and whole.progress > 0
        assert (whole.checkpoint is None) == (wf == "never-seen")
    assert len(answers) == WORKFLOWS + 1 and all(a is not None for a in answers)
    # The chunks were written in buckets, the root lists all of them.
    held = CheckpointView(settings).partition(0)
    assert not any(dirs.is_directory_key(key) for key in held)


def test_a_checkpoint_written_after_the_root_is_the_one_found(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = log_with_checkpoints(make_settings)
    whole_before = CheckpointView(settings).lookup(0, "wf-0", fresh=True)
    assert whole_before.checkpoint is not None
    pointer = last_root_pointer(settings)
    newer = WorkflowCheckpoint(
        "wf-0",
        settings.topic,
        0,
        last_offset(settings),  # newer, and no further than the step log reaches
        status="running",
        events=whole_before.checkpoint.events,
    )
    header: Headers = [(wire.CHECKPOINT_DIRECTORY_HEADER, str(pointer).encode())]
    write(settings, newer.key, encode(newer), header)
    answers = directory_answers(monkeypatch)
    fast, whole = fast_and_whole(settings, "wf-0")
    assert answers[0] is not None
    assert fast == whole and fast.checkpoint == newer


def test_a_record_without_the_header_sends_the_reader_to_the_whole_partition(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = log_with_checkpoints(make_settings)
    covered = last_offset(settings)
    older_writer = WorkflowCheckpoint("wf-1", settings.topic, 0, covered, status="completed")
    write(settings, older_writer.key, encode(older_writer), None)
    answers = directory_answers(monkeypatch)
    fast, whole = fast_and_whole(settings, "wf-1")
    assert answers == [None]
    assert fast == whole and fast.checkpoint == older_writer


@pytest.mark.kafka_only
def test_checkpoints_deleted_under_the_directory_are_never_taken_for_absent(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = log_with_checkpoints(make_settings, deletable=True)
    # What compaction does to a checkpoint rewritten elsewhere: its offset holds nothing.
    client = admin(settings)
    futures = client.delete_records([TopicPartition(settings.checkpoint_topic, 0, 5)])
    for future in futures.values():
        assert future.result(10).low_watermark == 5
    answers = directory_answers(monkeypatch)
    results = [fast_and_whole(settings, f"wf-{i}") for i in range(12)]  # offsets 0-4 too
    assert all(fast == whole for fast, whole in results)
    assert None in answers  # the deleted ones fell back to the whole read
    assert any(a is not None for a in answers)  # the others did not


def last_root_pointer(settings: Settings) -> int:
    """The root offset the checkpoint partition's last record names."""
    from stepledger.kafka.reader import PartitionReader

    where = (settings.checkpoint_topic, 0)
    with PartitionReader(settings, group="test-directory") as reader:
        _, high = reader.watermarks(where)
        last = next(r for b in reader.to_end({where: high - 1}, within=10) for r in b)
        pointer = dirs.root_pointer(last.headers)
    assert pointer is not None
    return pointer


def write(settings: Settings, key: bytes, value: bytes, headers: Headers | None) -> None:
    """A record as a checkpointer of this step log writes it (it names the log)."""
    producer = DurableProducer(settings)
    try:
        named: Headers = [*(headers or []), resolve(settings).header]
        future = producer.send(settings.checkpoint_topic, key, value, named, partition=0)
        producer.wait(future)
    finally:
        producer.close()


def last_offset(settings: Settings) -> int:
    """The offset of the step log's last record (partition 0)."""
    ends = LogStart(settings)
    try:
        return ends.end(settings.topic, 0) - 1
    finally:
        ends.close()


def test_ended_workflows_are_let_go_and_read_back_when_a_record_arrives(
    make_settings: Callable[..., Settings],
) -> None:
    settings = log_with_checkpoints(make_settings)
    checkpointer = Checkpointer(settings)
    try:
        checkpointer.restore()
        # Only the running workflows (every third) keep their values in memory.
        running = {f"wf-{i}" for i in range(0, WORKFLOWS, 3)}
        whole = CheckpointView(settings).partition(0)
        expected = sum(len(v) for k, c in whole.items() if k.decode() in running for v in c.events)
        assert checkpointer.held_bytes == expected > 0
        # A record for an ended workflow after all: its values come back from the checkpoint.
        ended = whole[b"wf-1"]
        with Ledger(settings) as ledger:
            late = ledger.events.envelope(
                "wf-1", None, ev.WorkflowFinished(status=WorkflowStatus.COMPLETED)
            )
            ledger.log.append(late)
        checkpointer.catch_up(timeout_s=60)
    finally:
        checkpointer.close()
    rewritten = CheckpointView(settings).lookup(0, "wf-1").checkpoint
    assert rewritten is not None and rewritten.covered_offset > ended.covered_offset
    assert rewritten.events[: len(ended.events)] == ended.events
    assert len(rewritten.events) == len(ended.events) + 1
    assert rewritten.offsets[-1] == rewritten.covered_offset

"""The Kafka history reads a partition the checkpoint directory vouches for from its
progress on: the workflow's checkpoint, then the partition's tail after the progress (the
directory and the tail index are one fact split at the progress offset)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepledger.checkpoints.writer import Checkpointer
from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.history import kafka as histories
from stepledger.history.kafka import KafkaHistory
from stepledger.history.records import read_to_end
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import checkpoint_topic_config
from stepledger.log import codec_for
from stepledger.producer import Ledger

PAY = Tool(name="pay", keyed=True)


def _checkpointed(settings: Settings) -> int:
    """Checkpoint what the log holds; the progress the checkpointer vouches for."""
    checkpointer = Checkpointer(settings)
    try:
        checkpointer.catch_up(timeout_s=60)
        return checkpointer._parts[0].progress
    finally:
        checkpointer.close()


@pytest.mark.parametrize("asked", [1, 8], ids=["then-whole", "directory"])
def test_a_partition_the_directory_vouches_for_is_read_from_its_progress_on(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, asked: int
) -> None:
    """``asked``: workflows answered by the directory before the checkpoints are read whole."""
    monkeypatch.setattr(histories, "SPLIT_RECORDS", 10)
    monkeypatch.setattr(histories, "DIRECTORY_WORKFLOWS", asked)
    settings = make_settings(partitions=1)
    topic = settings.checkpoint_topic
    ensure_topics(settings, [topic], partitions=1, configs={topic: checkpoint_topic_config()})
    with Ledger(settings) as ledger:
        long = ledger.start("long")  # runs across the progress
        long.step("a", PAY, {"n": 1}, lambda a, k: 1)
        done = ledger.start("done")  # wholly below it
        done.step("a", PAY, {"n": 2}, lambda a, k: 2)
        done.finish()
        for n in range(12):
            ledger.start(f"other-{n}").finish()
        progress = _checkpointed(settings)
        assert progress >= 20
        long.step("b", PAY, {"n": 3}, lambda a, k: 3)  # after the progress
        ledger.start("new").finish()
    codec = codec_for(settings)
    history = KafkaHistory(settings)
    try:
        for workflow_id in ("long", "done", "new", "nobody"):
            scanned = read_to_end(settings, codec, {(settings.topic, 0): 0}, workflow_id)[0]
            found = history.read(workflow_id)
            assert [e.event_id for e in found.events] == [e.event_id for e in scanned]
            assert found.whole
        # The index began after the progress: it never read what the directory vouched for.
        assert history.index.began((settings.topic, 0)) == progress + 1
        assert history.index.records <= 6  # b's intent and outcome, new's start and finish
        # The hints (an open may claim first): only once the checkpoints were read whole,
        # and only for an id without a checkpoint.
        brand_new = history.known("brand-new")
        if asked == 1:
            assert brand_new is not None and brand_new.events == [] and brand_new.whole
        else:
            assert brand_new is None  # the directory answers per id: no proof for others
        assert history.known("done") is None  # below the split: its checkpoint holds it
    finally:
        history.close()
    with Ledger(settings) as ledger:  # a resume through it replays, calls nothing again
        wf = ledger.workflow("long")
        assert wf.attempt == 2
        assert wf.step("a", PAY, {"n": 1}, lambda a, k: -1) == 1
        assert wf.step("b", PAY, {"n": 3}, lambda a, k: -1) == 3
        again = ledger.workflow("done")  # finished: replays
        assert again.step("a", PAY, {"n": 2}, lambda a, k: -1) == 2


def test_a_small_partition_is_read_from_its_start_as_before(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(partitions=1)
    topic = settings.checkpoint_topic
    ensure_topics(settings, [topic], partitions=1, configs={topic: checkpoint_topic_config()})
    with Ledger(settings) as ledger:
        ledger.start("w").finish()
    _checkpointed(settings)
    history = KafkaHistory(settings)
    try:
        assert [e.type for e in history.read("w").events] == [
            "workflow_started",
            "workflow_finished",
        ]
        assert history.index.began((settings.topic, 0)) == 0  # the hints answer for it
    finally:
        history.close()

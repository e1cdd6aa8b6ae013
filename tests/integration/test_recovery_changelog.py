"""The recovery daemon's one state store, the changelog topic: what the file stores did, on Kafka.

A partition that moves to a daemon on another machine (nothing shared but Kafka) resumes
from its position and tracked steps; another group's state is never taken; the daemon
creates the changelog, partitioned like the step log, and refuses one that is not.
"""

from __future__ import annotations

import pytest

from stepledger.config import Settings
from stepledger.errors import ConfigError
from stepledger.kafka import ensure_topics, topic_partitions
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger.recovery.checkpoint import CheckpointBatch
from tests.conftest import Factory, unique


def test_a_moved_partition_resumes_from_the_changelog_on_another_machine(
    make_settings: Factory,
) -> None:
    settings = make_settings(partitions=3)
    first = KafkaCheckpointStore(settings, "g")
    try:
        first.connect()  # creates the changelog
        assert len(topic_partitions(settings, settings.recovery_state_topic)) == 3
        first.save(
            settings.topic,
            CheckpointBatch(
                positions={0: 12, 2: 40},
                upserts={(2, "wf-1", "s1"): ['{"a": 1}'], (0, "wf-2", "s1"): ['{"b": 2}']},
            ),
        )
        first.save(settings.topic, CheckpointBatch(positions={2: 41}, deletes={(0, "wf-2", "s1")}))
    finally:
        first.close()
    second = KafkaCheckpointStore(settings, "g")  # a fresh process: nothing but the topic
    other = KafkaCheckpointStore(settings, "another-group")
    try:
        second.connect()  # exists already: kept as it is
        moved = second.load(settings.topic, 2)
        assert moved is not None and moved.next_offset == 41
        assert moved.steps == {("wf-1", "s1"): ['{"a": 1}']}
        kept = second.load(settings.topic, 0)
        assert kept is not None and kept.next_offset == 12 and kept.steps == {}
        assert second.load(settings.topic, 1) is None  # never checkpointed: replayed
        assert other.load(settings.topic, 2) is None  # another group's state
    finally:
        second.close()
        other.close()


def test_a_changelog_partitioned_unlike_the_step_log_is_one_line(make_settings: Factory) -> None:
    settings: Settings = make_settings(partitions=3, recovery_state_topic=unique("state"))
    ensure_topics(settings, [settings.recovery_state_topic], partitions=1)
    store = KafkaCheckpointStore(settings, "g")
    try:
        with pytest.raises(ConfigError, match="partitioned like the step log") as raised:
            store.connect()
    finally:
        store.close()
    assert "\n" not in str(raised.value)

"""Recovery checkpoints per partition in a shared directory: the next owner resumes from them."""

from __future__ import annotations

from pathlib import Path

from stepledger.recovery.checkpoint import CheckpointBatch, PartitionedCheckpointStore


def test_a_moved_partition_is_resumed_by_another_daemon_from_its_own_file(tmp_path: Path) -> None:
    first = PartitionedCheckpointStore(tmp_path, "g")
    batch = CheckpointBatch(
        positions={0: 12, 5: 40},
        upserts={(5, "wf-1", "s1"): ['{"a": 1}'], (0, "wf-2", "s1"): ['{"b": 2}']},
    )
    first.save("log", batch)
    first.save("log", CheckpointBatch(positions={5: 41}, deletes={(0, "wf-2", "s1")}))
    first.close()
    assert sorted(p.name for p in tmp_path.glob("*.sqlite")) == [
        "recovery-g-log.p0000.sqlite",
        "recovery-g-log.p0005.sqlite",
    ]
    second = PartitionedCheckpointStore(tmp_path, "g")
    moved = second.load("log", 5)
    assert moved is not None and moved.next_offset == 41
    assert moved.steps == {("wf-1", "s1"): ['{"a": 1}']}
    kept = second.load("log", 0)
    assert kept is not None and kept.next_offset == 12 and kept.steps == {}
    assert second.load("log", 3) is None
    assert PartitionedCheckpointStore(tmp_path, "other").load("log", 5) is None
    second.close()

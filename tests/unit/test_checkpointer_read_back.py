"""An ended workflow's values are let go; one that cannot be read back stops the vouching."""

from __future__ import annotations

from stepledger.checkpoints.view import Covering
from stepledger.checkpoints.writer import Checkpointer, _Partition, _Workflow
from stepledger.config import Settings
from stepledger.kafka.records import Consumed


def _record(offset: int, key: bytes = b"wf-1") -> Consumed:
    return Consumed("log", 0, offset, key, b"late record")


class _NoCheckpoint:
    """A checkpoint topic that has lost the workflow's checkpoint."""

    def at(self, partition: int, offset: int, key: bytes) -> None:
        return None

    def lookup(self, partition: int, workflow_id: str, *, fresh: bool = True) -> Covering:
        return Covering(None, 40)


def test_a_checkpoint_that_cannot_be_read_back_stops_the_partition_not_the_daemon() -> None:
    checkpointer = Checkpointer(Settings(bootstrap="127.0.0.1:9"), partitions=[0])
    part = _Partition(0, progress=40, read_to=40)
    part.workflows[b"wf-1"] = _Workflow([], [], covered=30, written=30, evicted=True)
    part.directory.put(b"wf-1", 7)
    checkpointer._parts[0] = part
    checkpointer._points = _NoCheckpoint()  # type: ignore[assignment]
    checkpointer.take(_record(41))
    assert part.broken
    held = part.workflows[b"wf-1"]
    assert held.values == [] and held.evicted and held.covered == 30  # nothing half-extended
    checkpointer.take(_record(42, b"wf-2"))
    assert b"wf-2" not in part.workflows  # a broken partition takes nothing more
    checkpointer.close()

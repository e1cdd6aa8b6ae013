"""What the checkpoint view hands out is never contradicted by the step log itself."""

from __future__ import annotations

import pytest

from stepledger.checkpoints.record import WorkflowCheckpoint
from stepledger.checkpoints.view import CheckpointView, Covering
from stepledger.config import Settings
from stepledger.kafka.logid import LogIdentity

SETTINGS = Settings(topic="events")
END = 100


class Ends:
    def __init__(self) -> None:
        self.asked = 0

    def end(self, topic: str, partition: int) -> int:
        assert topic == "events"
        self.asked += 1
        return END


def view() -> tuple[CheckpointView, Ends]:
    ends = Ends()
    identity = LogIdentity("events", "id")
    return CheckpointView(SETTINGS, identity=identity, log_ends=ends), ends


def test_a_checkpoint_and_progress_below_the_end_are_handed_out() -> None:
    found = Covering(WorkflowCheckpoint("wf", "events", 0, END - 1), END - 1)
    checked, _ = view()
    assert checked._vouched(0, found) == found


def test_nothing_to_vouch_for_asks_nothing() -> None:
    checked, ends = view()
    assert checked._vouched(0, Covering(None, None)) == Covering(None, None)
    assert ends.asked == 0


@pytest.mark.parametrize(
    "checkpoint",
    [
        WorkflowCheckpoint("wf", "events", 0, END),  # past the end: no one read that record
        WorkflowCheckpoint("wf", "orders", 0, 5),  # folded from another topic
        WorkflowCheckpoint("wf", "events", 1, 5),  # from another partition
    ],
)
def test_a_checkpoint_the_step_log_contradicts_is_refused(checkpoint: WorkflowCheckpoint) -> None:
    checked, _ = view()
    assert checked._vouched(0, Covering(checkpoint, 10)) == Covering(None, 10)
    assert checked.refusals.total == 1


def test_a_progress_at_or_past_the_end_proves_nothing() -> None:
    checked, _ = view()
    assert checked._vouched(0, Covering(None, END)) == Covering(None, None)
    assert checked._vouched(0, Covering(None, 10**12)) == Covering(None, None)
    assert checked.refusals.total == 2

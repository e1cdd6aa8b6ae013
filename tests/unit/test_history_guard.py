"""When a workflow's history is complete after the log's head expired (pure: fakes for Kafka)."""

from __future__ import annotations

import pytest

from stepledger.checkpoints.record import WorkflowCheckpoint
from stepledger.checkpoints.view import Covering
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.errors import HistoryExpiredError
from stepledger.history.guard import HistoryGuard
from tests.unit.factories import factory, pay_tool

CODEC = Codec()
SETTINGS = Settings(topic="events")


class Starts:
    def __init__(self, low: int) -> None:
        self.low = low

    def of(self, topic: str, partition: int) -> int:
        return self.low

    def end(self, topic: str, partition: int) -> int:
        return self.low + 1000

    def close(self) -> None:
        pass


class View:
    def __init__(
        self, checkpoint: WorkflowCheckpoint | None, progress: int | None, doubtful: bool = False
    ) -> None:
        self.covering = Covering(checkpoint, progress, doubtful)

    def lookup(self, partition: int, workflow_id: str, *, fresh: bool = True) -> Covering:
        return self.covering

    def holds(self, partition: int, workflow_id: str) -> bool | None:
        return None


def history() -> list[ev.Event]:
    f = factory()
    return [
        f.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5),
        f.intent("wf", "pay", pay_tool(), {"cents": 1}, sequence=0),
    ]


def guard(
    low: int, checkpoint: WorkflowCheckpoint | None = None, progress: int | None = None
) -> HistoryGuard:
    view = View(checkpoint, progress)
    return HistoryGuard(SETTINGS, CODEC, log_start=Starts(low), checkpoints=view)


def checkpoint_of(events: list[ev.Event], covered: int) -> WorkflowCheckpoint:
    values = tuple(CODEC.encode(e) for e in events)
    return WorkflowCheckpoint("wf", "events", 0, covered, "running", 1, 1, values)


def test_nothing_deleted_the_tail_is_everything() -> None:
    assert guard(0).complete("wf", 0, []) == []


def test_a_checkpoint_covering_the_log_start_completes_the_tail() -> None:
    events = history()
    done = guard(10, checkpoint_of(events[:1], covered=9)).complete("wf", 0, events[1:])
    assert [e.event_id for e in done] == [e.event_id for e in events]


def test_a_checkpoint_and_tail_overlapping_are_deduplicated() -> None:
    events = history()
    done = guard(5, checkpoint_of(events, covered=6)).complete("wf", 0, events[1:])
    assert [e.event_id for e in done] == [e.event_id for e in events]


def test_an_old_checkpoint_is_enough_when_progress_covers_the_log_start() -> None:
    events = history()
    done = guard(50, checkpoint_of(events, covered=3), progress=70).complete("wf", 0, [])
    assert len(done) == 2


def test_progress_proves_an_id_without_checkpoint_new() -> None:
    assert guard(50, None, progress=49).complete("wf", 0, []) == []


def test_a_tail_starting_with_the_first_start_is_complete() -> None:
    events = history()
    assert guard(50).complete("wf", 0, events) == events


@pytest.mark.parametrize(
    ("checkpoint_covers", "progress"), [(None, None), (None, 40), (20, 30), (20, None)]
)
def test_anything_unproven_is_refused(checkpoint_covers: int | None, progress: int | None) -> None:
    events = history()
    checkpoint = None if checkpoint_covers is None else checkpoint_of(events[:1], checkpoint_covers)
    with pytest.raises(HistoryExpiredError) as caught:
        guard(50, checkpoint, progress).complete("wf", 0, events[1:])
    assert caught.value.log_start == 50 and caught.value.partition == 0


def test_a_snapshot_past_the_log_start_needs_nothing_more() -> None:
    events = history()[1:]
    assert guard(50).complete("wf", 0, events, read_from=60) == events


def test_no_checkpoint_proves_nothing_where_a_checkpoint_could_not_be_decoded() -> None:
    """The progress vouches that every workflow below it has a checkpoint; one the view
    skipped as undecodable may be this one's, so its absence proves no id new."""
    tail = history()[1:]  # the start expired: the tail alone is not the whole history
    assert guard(50, progress=70).complete("wf", 0, tail) == tail
    doubtful = HistoryGuard(
        SETTINGS, CODEC, log_start=Starts(50), checkpoints=View(None, 70, doubtful=True)
    )
    with pytest.raises(HistoryExpiredError):
        doubtful.complete("wf", 0, tail)

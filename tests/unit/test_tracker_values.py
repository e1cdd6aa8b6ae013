"""The daemon's tracker keeps each step's events as Avro values, not decoded events and folds.

Memory per open intent was 7.7x its encoded size (a decoded event's strings, its fold and a
JSON copy per step); the tracker now keeps the value and the few things the fold said.
"""

from __future__ import annotations

import gc
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from stepledger.codec import REGISTRY_MAGIC, Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.events import Event
from stepledger.domain.state import StepStatus
from stepledger.kafka.records import Consumed, Polled
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import CHECKPOINT_AFTER_CHANGES, RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.recovery.runs import LatestClaims
from stepledger.recovery.tracker import Tracker
from stepledger.resolution.registry import ToolRegistry
from tests.unit.factories import T0, LogStartAtZero, factory, pay_tool

PAY = pay_tool(timeout_s=60)
ARGS = {"amount": 1250, "currency": "EUR", "customer": "cus_0001", "memo": "x" * 120}


def _due(tracker_grace: timedelta = timedelta(0)) -> Tracker:
    return Tracker(lambda step, arrival: rs.due_at(step, PAY, grace=tracker_grace, arrival=arrival))


def test_an_open_intent_costs_the_tracker_at_most_three_times_its_encoded_size() -> None:
    events, codec = factory(), Codec()
    values = [
        codec.encode(events.intent(f"wf-{i}", "s", PAY, {**ARGS, "i": i}, sequence=0))
        for i in range(1000)
    ]
    decoded = [codec.decode(value) for value in values]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        tracker = Tracker(
            lambda step, arrival: rs.due_at(step, PAY, grace=timedelta(0), arrival=arrival)
        )
        for offset, event in enumerate(decoded):
            tracker.apply(event, 0, offset)
        gc.collect()
        pending = tracemalloc.take_snapshot()  # changed since the last checkpoint, all of them
        tracker.take_batch(T0)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    encoded = sum(len(value) for value in values)
    assert tracker.open_count() == 1000
    for snapshot in (pending, after):
        retained = sum(stat.size_diff for stat in snapshot.compare_to(before, "filename"))
        assert retained <= 3 * encoded, f"{retained / encoded:.1f}x the encoded size"


def test_the_value_as_read_is_kept_and_another_framing_is_encoded_again() -> None:
    events, codec = factory(), Codec()
    intent = events.intent("wf", "s", PAY, ARGS, sequence=0)
    value = codec.encode(intent)
    tracker = _due()
    tracker.apply(intent, 0, 0, value)
    assert tracker.steps[("wf", "s")].values[0] is value
    # A registry-framed value is kept in the tracker's own framing: it decodes after a
    # restart without asking the registry.
    other = events.intent("wf-2", "s", PAY, ARGS, sequence=0)
    tracker.apply(other, 0, 1, REGISTRY_MAGIC + (7).to_bytes(4, "big") + b"body")
    kept = tracker.steps[("wf-2", "s")].values[0]
    assert kept.startswith(codec.prefix) and Codec().decode(kept) == other


def test_a_tracked_step_is_folded_again_from_its_values_as_events_arrive() -> None:
    events = factory()
    tracker = _due()
    intent = events.intent("wf", "s", PAY, ARGS, sequence=0)
    decided = events.outcome(
        "wf", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY
    )
    late = events.outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED)
    tracker.apply(intent, 0, 0)
    assert tracker.events_of(("wf", "s")) == (intent,)  # handed to a worker
    assert tracker.apply(decided, 0, 1) is None
    assert tracker.apply(decided, 0, 2) is None  # a duplicate changes nothing
    found = tracker.apply(late, 0, 3)
    assert found is not None and found.event == late
    tracked = tracker.steps[("wf", "s")]
    assert (
        tracked.status is StepStatus.NOT_HAPPENED and tracked.resolved_by is Source.RECOVERY_QUERY
    )
    assert tracked.step.status is StepStatus.NOT_HAPPENED
    lines = tracker.take_batch(T0).upserts[(0, "wf", "s")]
    assert [Event.model_validate_json(line) for line in lines] == [intent, decided, late]
    assert tracker.open_count() == 0 and set(tracker.steps) == {("wf", "s")}


def _daemon(
    tmp_path: Path, store: InMemoryCheckpointStore, now: datetime, **options: Any
) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([PAY]),
        DaemonOptions(state_dir=tmp_path, workers=1, grace_s=0.0, **options),
        log=InMemoryEventLog(),
        store=store,
        dead_letters=MemoryEventLetters(),
        clock=lambda: now,
    )
    daemon._log_start = LogStartAtZero(daemon.settings)  # no broker: nothing deleted
    return daemon


def test_a_step_taken_over_in_doubt_falls_due_a_timeout_after_the_take_over(
    tmp_path: Path,
) -> None:
    events = factory()
    started = events.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=3)
    intent = events.intent("wf", "s", PAY, ARGS, sequence=0)  # deadline T0 + 60 s
    store = InMemoryCheckpointStore()
    first = _daemon(tmp_path, store, T0)
    first._on_assign([("log", 0)])
    for offset, event in enumerate([started, intent]):
        first._handle(Consumed("log", 0, offset, None, Codec().encode(event)))
    first.checkpoint()
    taken_at = datetime(2026, 6, 1, tzinfo=UTC)
    owner = _daemon(tmp_path, store, taken_at)
    owner._on_assign([("log", 0)])
    owner.caught_up.add(0)
    assert owner.tracker.due(taken_at + timedelta(seconds=59), 10, {0}) == []
    assert owner.tracker.due(taken_at + timedelta(seconds=61), 10, {0}) == [("wf", "s")]
    first.work.shutdown(wait=True)
    owner.work.shutdown(wait=True)


def test_a_workflows_latest_claim_is_kept_as_a_value_and_recent_ones_decoded() -> None:
    events, codec = factory(), Codec()
    started = events.workflow_started(
        "wf", name="", attempt=1, read_only=False, max_attempts=3, runner="A"
    )
    resumed = events.workflow_resumed("wf", attempt=2, reason="crash", runner="B")
    claims = LatestClaims(decoded=1)
    value = codec.encode(started)
    assert claims.remember(started, value) and not claims.remember(started, value)
    intent = codec.encode(events.intent("wf", "s", PAY, ARGS, sequence=0))
    folded = claims.decoded("wf", (value, intent))
    assert folded[0] is started and folded[1].type == "step_intended"  # the claim not decoded
    assert claims.remember(resumed, codec.encode(resumed))
    assert claims.remember(started, value) is False  # stale: attempt 1 after attempt 2
    other = events.workflow_started("other", name="", attempt=1, read_only=False, max_attempts=3)
    assert claims.remember(other, codec.encode(other))  # "wf" is no longer kept decoded
    assert claims.event("wf") == resumed  # decoded again from its value


def test_checkpoint_lines_are_the_steps_events_made_at_the_checkpoint() -> None:
    events, codec = factory(), Codec()
    intents = [events.intent(f"wf-{i}", "s", PAY, ARGS, sequence=0) for i in range(50)]
    decided = events.outcome(
        "wf-0", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY
    )
    tracker = Tracker(
        lambda step, arrival: rs.due_at(step, PAY, grace=timedelta(0), arrival=arrival)
    )
    for offset, intent in enumerate(intents):
        tracker.apply(intent, 0, offset, codec.encode(intent))
    tracker.apply(decided, 0, 50, codec.encode(decided))
    batch = tracker.take_batch(T0)
    # A new intent's line comes from its value, a decided step's from its events.
    assert [Event.model_validate_json(line) for line in batch.upserts[(0, "wf-0", "s")]] == [
        intents[0],
        decided,
    ]
    assert [Event.model_validate_json(line) for line in batch.upserts[(0, "wf-3", "s")]] == [
        intents[3]
    ]
    assert len(batch.upserts) == 50


class _Records:
    """A consumer whose polls hand out the records queued in it."""

    def __init__(self) -> None:
        self.queued: list[Consumed] = []

    def poll(self, limit: int, wait: float) -> Polled:
        taken, self.queued = self.queued[:limit], self.queued[limit:]
        return Polled(taken)


def test_a_burst_of_changes_is_checkpointed_before_the_interval_is_up(tmp_path: Path) -> None:
    # The lines of changed steps are made when a checkpoint takes them, on the loop: a
    # checkpoint is taken once CHECKPOINT_AFTER_CHANGES steps changed, so one burst never
    # holds the loop for all of its intents at once.
    events, codec, store = factory(), Codec(), InMemoryCheckpointStore()
    daemon = _daemon(tmp_path, store, T0, checkpoint_interval_s=3600.0)
    consumer = _Records()
    daemon._on_assign([("log", 0)])
    daemon.tick(consumer)  # type: ignore[arg-type]  # the first turn checkpoints: nothing yet
    values = [
        codec.encode(events.intent(f"wf-{i}", "s", PAY, ARGS, sequence=0))
        for i in range(CHECKPOINT_AFTER_CHANGES)
    ]
    records = [Consumed("log", 0, offset, None, value) for offset, value in enumerate(values)]
    consumer.queued = records[:-1]
    while consumer.queued:
        daemon.tick(consumer)  # type: ignore[arg-type]
    saved = store.load("log", 0)
    assert saved is not None and saved.next_offset == 0 and not saved.steps
    assert daemon.tracker.changed == CHECKPOINT_AFTER_CHANGES - 1
    consumer.queued = records[-1:]
    daemon.tick(consumer)  # type: ignore[arg-type]
    saved = store.load("log", 0)
    assert saved is not None and saved.next_offset == CHECKPOINT_AFTER_CHANGES
    assert len(saved.steps) == CHECKPOINT_AFTER_CHANGES and daemon.tracker.changed == 0
    daemon.work.shutdown(wait=True)

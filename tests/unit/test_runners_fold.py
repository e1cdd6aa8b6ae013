"""The fold fences runners: claims, zombie intents, other runners' outcomes, kept keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stepledger.domain import events as ev
from stepledger.domain import ids, oversize
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, Source, WorkflowStatus
from stepledger.domain.replay import MoveKind, next_move
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import ResultTypeError
from stepledger.recovery.checkpoint import PartitionCheckpoint
from stepledger.recovery.clock import LOG_APPEND_TIME, DeadlineClock
from stepledger.recovery.tracker import Tracker
from tests.unit.factories import factory
from tests.unit.resume_fakes import Crash, World

MAIL = Tool(name="mail", effect="irreversible", policy="escalate")


def claim(attempt: int, runner: str) -> ev.Event:
    events = factory()
    if attempt == 1:
        return events.workflow_started(
            "wf", name="", attempt=1, read_only=False, max_attempts=5, runner=runner
        )
    return events.workflow_resumed("wf", attempt=attempt, reason=None, runner=runner)


def intent(epoch: int, runner: str, attempt: int = 1) -> ev.Event:
    return factory().intent(
        "wf", "s", MAIL, {"to": "a"}, sequence=0, attempt=attempt, epoch=epoch, runner=runner
    )


def test_an_intent_after_a_newer_claim_is_a_zombie_and_decides_nothing() -> None:
    zombie, owner = intent(1, "A"), intent(2, "B")
    state = replay("wf", [claim(1, "A"), claim(2, "B"), zombie, owner])
    assert zombie.event_id != owner.event_id
    assert [(a.event_id, a.kind) for a in state.anomalies] == [(zombie.event_id, "zombie_intent")]
    assert state.steps["s"].runner == "B" and state.steps["s"].epoch == 2


def test_an_intent_before_the_newer_claim_stands_and_its_outcome_is_accepted() -> None:
    first = intent(1, "A")
    done = factory().outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, runner="A")
    state = replay("wf", [claim(1, "A"), first, claim(2, "B"), done])
    assert state.steps["s"].status is StepStatus.SUCCEEDED and not state.anomalies


def test_a_second_claim_of_the_same_attempt_owns_nothing() -> None:
    late = intent(2, "C")
    state = replay("wf", [claim(1, "A"), claim(2, "B"), claim(2, "C"), late])
    assert [a.kind for a in state.anomalies] == ["competing_claim", "zombie_intent"]
    assert state.runner == "B" and "s" not in state.steps


def test_an_agent_outcome_from_another_runner_is_refused() -> None:
    other = factory().outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, runner="A")
    state = replay("wf", [claim(1, "A"), claim(2, "B"), intent(2, "B"), other])
    assert [a.kind for a in state.anomalies] == ["zombie_outcome"]
    assert state.steps["s"].status is StepStatus.INTENDED


def test_events_without_runners_are_not_fenced() -> None:
    events = factory()
    started = events.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)
    old = events.intent("wf", "s", MAIL, {"to": "a"}, sequence=0)
    resumed = events.workflow_resumed("wf", attempt=2, reason=None)
    state = replay("wf", [started, resumed, old])
    assert state.steps["s"].status is StepStatus.INTENDED and not state.anomalies


def test_a_not_happened_step_runs_again_under_the_same_key_a_failure_under_a_new_one() -> None:
    events = factory()
    first = intent(1, "A")
    nothing = events.outcome(
        "wf", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY
    )
    state = replay("wf", [claim(1, "A"), first, nothing])
    move = next_move(state, "s", MAIL, position=0, replaying=True)
    assert move.kind is MoveKind.RUN and move.attempt == 2
    assert isinstance(first.body, ev.StepIntended)
    assert move.key == first.body.idempotency_key
    again = events.intent("wf", "s", MAIL, {"to": "a"}, sequence=0, attempt=2, key=move.key)
    failed = events.outcome("wf", "s", attempt=2, status=OutcomeStatus.FAILED, error="boom")
    state = replay("wf", [claim(1, "A"), first, nothing, again, failed])
    move = next_move(state, "s", MAIL, position=0, replaying=False)
    assert move.kind is MoveKind.RUN and move.attempt == 3 and move.key is None


def test_the_daemon_tracks_no_zombie_intent_of_a_workflow_whose_claim_it_read() -> None:
    tracker = Tracker(lambda step, arrival: step.deadline)
    events = [claim(1, "A"), claim(2, "B"), intent(1, "A")]
    for offset, event in enumerate(events):
        tracker.apply(event, 0, offset)
    assert not tracker.steps
    tracker.apply(intent(2, "B"), 0, 3)
    assert tracker.steps[("wf", "s")].step.runner == "B"


def test_a_resume_claim_reaches_a_tracked_step_of_its_workflow() -> None:
    tracker = Tracker(lambda step, arrival: step.deadline)
    tracker.apply(claim(1, "A"), 0, 0)
    tracker.apply(claim(2, "B"), 0, 1)
    tracker.apply(intent(2, "B"), 0, 2)
    tracker.apply(claim(3, "C"), 0, 3)
    tracker.apply(intent(2, "B", attempt=1), 0, 4)  # a duplicate: already seen
    tracked = tracker.steps[("wf", "s")]
    assert tracked.state.attempt == 3 and tracked.state.runner == "C"


def test_an_intent_read_by_a_daemon_ahead_of_the_agent_is_re_anchored() -> None:
    clock = DeadlineClock()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    behind = factory().intent("wf", "s", MAIL, {"to": "a"}, sequence=0)  # clock of 2026-01-01
    agent_behind = behind.model_copy(update={"occurred_at": now - timedelta(seconds=120)})
    body = behind.body
    assert isinstance(body, ev.StepIntended)
    late_deadline = body.model_copy(
        update={"deadline": now - timedelta(seconds=120 - MAIL.timeout_s)}
    )
    agent_behind = agent_behind.model_copy(update={"body": late_deadline})
    appended, stamped = clock.appended((0, 0), now)
    assert (appended, stamped) == (now, False)
    clock.measure(agent_behind, appended, prompt=False)
    assert clock.largest() is None  # read late, or a producer behind: not sure which
    clock.measure(agent_behind, appended, prompt=True)
    step = replay("wf", [agent_behind]).steps["s"]
    arrival = rs.Arrival(appended, appended)
    due = rs.due_at(step, MAIL, grace=timedelta(seconds=0.5), arrival=arrival)
    assert due == now + timedelta(seconds=MAIL.timeout_s + 0.5)
    assert clock.largest() == -120.0


def test_broker_time_anchors_a_record_read_late() -> None:
    clock = DeadlineClock()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    millis = int(now.timestamp() * 1000)
    clock.observe((LOG_APPEND_TIME, millis - 2), now)  # a fresh record: lead ~2 ms
    appended, stamped = clock.appended((LOG_APPEND_TIME, millis - 60_000), now)
    assert stamped and abs((now - appended).total_seconds() - 59.998) < 0.01


def test_a_re_drive_whose_result_is_too_large_records_its_digest_once() -> None:
    world = World()
    calls: list[str] = []

    def export(args: dict[str, object], key: str) -> dict[str, str]:
        calls.append(key)
        return {"blob": "x" * 1_100_000}

    tool = Tool(name="export", keyed=True, timeout_s=1.0, run=export)

    def crash(args: dict[str, object], key: str) -> None:
        raise Crash()

    with pytest.raises(Crash):
        world.ledger().workflow("wf").step("export", tool, {}, crash)
    ledger = world.ledger(tools=False)
    ledger.tools.register(tool)
    with pytest.raises(ResultTypeError, match=r"'export'.*larger than"):
        ledger.workflow("wf").step("export", tool, {})  # re-driven by the resume, then replayed
    step = replay("wf", world.log.workflow_events("wf")).steps["export"]
    assert step.status is StepStatus.SUCCEEDED and step.result_type == oversize.TOO_LARGE
    assert len(calls) == 1 and step.resolved_by is Source.RECOVERY_REDRIVE


def test_a_late_recovery_compensation_of_an_attempt_that_kept_its_key_is_stale() -> None:
    events = factory()
    first = intent(1, "A")
    assert isinstance(first.body, ev.StepIntended)
    key = first.body.idempotency_key
    nothing = events.outcome(
        "wf", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY
    )
    again = events.intent("wf", "s", MAIL, {"to": "a"}, sequence=0, attempt=2, key=key)
    late = ev.CompensationIntended(
        idempotency_key=ids.compensation_key(key),
        reason="intent without outcome past its deadline",
        source=Source.RECOVERY_COMPENSATE,
        deadline=datetime(2026, 1, 1, tzinfo=UTC),
        attempt=1,
    )
    claim_event = events.envelope("wf", "s", late, 1, "recovery", "daemon-1")
    state = replay("wf", [claim(1, "A"), first, nothing, again, claim_event])
    assert [a.kind for a in state.anomalies] == ["stale_compensation"]
    assert state.steps["s"].status is StepStatus.INTENDED and state.steps["s"].attempt == 2


def test_a_fenced_off_runner_cannot_end_the_workflow() -> None:
    events = factory()
    done = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED, runner="A")
    end = events.envelope("wf", None, done)
    state = replay("wf", [claim(1, "A"), claim(2, "B"), end])
    assert [a.kind for a in state.anomalies] == ["zombie_finish"]
    assert state.status is RunStatus.RUNNING
    mine = events.envelope("wf", None, done.model_copy(update={"runner": "B"}))
    assert mine.event_id != end.event_id
    after = replay("wf", [claim(1, "A"), claim(2, "B"), end, mine])
    assert after.status is RunStatus.COMPLETED


def test_a_daemon_restarted_from_its_checkpoint_still_knows_the_claims() -> None:
    tracker = Tracker(lambda step, arrival: step.deadline)
    for offset, event in enumerate([claim(1, "A"), claim(2, "B"), intent(2, "B")]):
        tracker.apply(event, 0, offset)
    saved = PartitionCheckpoint(3, {("wf", "s"): list(tracker.steps[("wf", "s")].events)})
    restarted = Tracker(lambda step, arrival: step.deadline)
    restarted.load(0, saved)
    zombie = factory().intent("wf", "t", MAIL, {"to": "a"}, sequence=1, epoch=1, runner="A")
    restarted.apply(zombie, 0, 3)
    assert ("wf", "t") not in restarted.steps and ("wf", "s") in restarted.steps

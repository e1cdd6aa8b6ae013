"""Every effect a runner makes goes through one ownership check (in memory).

A zombie is a runner whose claim of the workflow a newer (or competing) claim fenced off.
Its compensation intents, like its intents, are anomalies that decide nothing (the fold),
and it calls nothing: not a saga's compensation, not a keyed call, not an approved call,
not a compensation while it settles a step in doubt.  Its own records landing one after
another prove its claims without reading the log again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain.enums import EffectClass, OutcomeStatus, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import (
    ApprovalPendingError,
    WorkflowDeadLetteredError,
    WorkflowTakenOverError,
)
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import History
from stepledger.kafka import Position
from stepledger.producer import Workflow, approval, opening
from stepledger_dev.simulate import defects
from tests.unit.factories import factory
from tests.unit.resume_fakes import Crash, World

BOOK = Tool(name="book", effect="compensatable", keyed=True, compensate=lambda a, k, r: None)
STAY = {"hotel": "Lisboa"}
CARD = {"amount": 1200}


def claim(attempt: int, runner: str) -> ev.Event:
    events = factory()
    if attempt == 1:
        return events.workflow_started(
            "wf", name="", attempt=1, read_only=False, max_attempts=5, runner=runner
        )
    return events.workflow_resumed("wf", attempt=attempt, reason=None, runner=runner)


def booked(runner: str = "A") -> list[ev.Event]:
    events = factory()
    intent = events.intent("wf", "s", BOOK, STAY, sequence=0, epoch=1, runner=runner)
    done = events.outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, runner=runner)
    return [claim(1, runner), intent, done]


def undo(epoch: int, runner: str | None, source: Source = Source.AGENT) -> ev.Event:
    body = ev.CompensationIntended(
        idempotency_key=ids.compensation_key(ids.idempotency_key("wf", "s", "book", 1)),
        reason="r",
        source=source,
        deadline=factory().clock() + timedelta(seconds=5),
        attempt=1,
        epoch=epoch,
        runner=runner,
    )
    return factory().envelope("wf", "s", body, epoch, runner)


# -- the fold ------------------------------------------------------------------------------


def test_a_compensation_after_a_newer_claim_is_a_zombie_and_decides_nothing() -> None:
    zombie = undo(1, "A")
    state = replay("wf", [*booked(), claim(2, "B"), zombie])
    assert [(a.event_id, a.kind) for a in state.anomalies] == [
        (zombie.event_id, "zombie_compensation")
    ]
    assert state.steps["s"].status is StepStatus.SUCCEEDED


def test_a_compensation_by_the_owner_or_before_the_newer_claim_stands() -> None:
    owner = replay("wf", [*booked(), claim(2, "B"), undo(2, "B")])
    first = replay("wf", [*booked(), undo(1, "A"), claim(2, "B")])
    for state in (owner, first):
        assert state.steps["s"].status is StepStatus.COMPENSATING and not state.anomalies


def test_a_compensation_under_a_competing_claim_of_the_same_attempt_is_a_zombie() -> None:
    state = replay("wf", [*booked(), claim(2, "B"), claim(2, "C"), undo(2, "C")])
    assert [a.kind for a in state.anomalies] == ["competing_claim", "zombie_compensation"]
    assert state.steps["s"].status is StepStatus.SUCCEEDED


def test_the_recovery_daemons_compensation_names_no_runner_and_is_not_fenced() -> None:
    events = factory()
    intent = events.intent("wf", "s", BOOK, STAY, sequence=0, epoch=1, runner="A")
    daemon = undo(0, None, Source.RECOVERY_COMPENSATE)
    state = replay("wf", [claim(1, "A"), intent, claim(2, "B"), daemon])
    assert state.steps["s"].status is StepStatus.COMPENSATING and not state.anomalies


# -- every effect path of a runner ---------------------------------------------------------


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_zombies_saga_cancels_nothing_of_a_trip_the_owner_completed(pipelined: bool) -> None:
    world = World(pipeline_outcomes=pipelined)
    book = world.services.book
    zombie = world.ledger().workflow("wf")
    zombie.step("book", book, STAY)
    owner = world.ledger().workflow("wf")
    owner.step("book", book, STAY)  # replayed
    owner.finish()
    with pytest.raises(WorkflowTakenOverError) as caught:
        zombie.compensate("the trip was called off")
    assert "nothing was called" in str(caught.value) and "\n" not in str(caught.value)
    assert world.services.effects["cancel"] == 0
    state = replay("wf", world.log.workflow_events("wf"))
    assert (
        state.status is RunStatus.COMPLETED and state.steps["book"].status is StepStatus.SUCCEEDED
    )
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_zombies_keyed_call_is_not_made_for_a_trip_the_owner_compensated(
    pipelined: bool,
) -> None:
    world = World(pipeline_outcomes=pipelined)
    services = world.services
    zombie = world.ledger().workflow("wf")
    zombie.step("book", services.book, STAY)
    owner = world.ledger().workflow("wf")
    assert owner.compensate("the trip was called off") == ["book"]
    with pytest.raises(WorkflowTakenOverError):
        zombie.step("charge", services.charge, CARD)
    assert services.calls["charge"] == 0 and services.effects["cancel"] == 1
    state = replay("wf", world.log.workflow_events("wf"))
    assert state.status is RunStatus.COMPENSATED and "charge" not in state.steps
    assert [a.kind for a in state.anomalies] == ["zombie_intent"]


def test_a_zombie_settling_a_step_in_doubt_compensates_nothing() -> None:
    world = World()
    undone: list[str] = []
    hold = Tool(
        name="hold",
        effect=EffectClass.COMPENSATABLE,
        keyed=True,
        timeout_s=1,
        run=lambda args, key: {"hold": key},
        compensate=lambda args, key, known: undone.append(key),
    )

    def crash(args: dict[str, Any], key: str) -> Any:
        raise Crash()

    zombie = world.ledger().workflow("wf")
    with pytest.raises(Crash):
        zombie.step("hold", hold, STAY, crash)  # the intent stays in doubt
    world.ledger(tools=False).workflow("wf")  # the new owner claims, settles nothing yet
    with pytest.raises(WorkflowTakenOverError):
        zombie.step("hold", hold, STAY)  # due: the zombie's resolver would compensate
    assert undone == []
    state = replay("wf", world.log.workflow_events("wf"))
    assert state.steps["hold"].status is StepStatus.INTENDED
    assert [a.kind for a in state.anomalies] == ["zombie_compensation"]
    # The owner settles it: the zombie's claim decided nothing.
    ledger = world.ledger(tools=False)
    ledger.tools.register(hold)
    assert ledger.workflow("wf").state.steps["hold"].status is StepStatus.COMPENSATED
    assert len(undone) == 1


def test_a_zombies_approved_keyed_call_is_not_made() -> None:
    world = World(approval_wait_s=1.0)
    charge = world.services.charge.model_copy(update={"requires_approval": True})
    zombie = world.ledger().workflow("wf")
    with pytest.raises(ApprovalPendingError):
        zombie.step("charge", charge, CARD)
    human = EventFactory("fleet", "inbox", clock=world.clock)
    reader = InMemoryHistory(world.log)
    approval.decide(world.log, human, reader, "wf", "charge", granted=True, by="ann")
    world.ledger().workflow("wf")  # the new owner claims
    with pytest.raises(WorkflowTakenOverError):
        zombie.step("charge", charge, CARD)
    assert world.services.calls["charge"] == 0


@pytest.mark.parametrize("switch", [(), ("unclaimed_dead_letter",)], ids=["fixed", "reverted"])
def test_a_resume_past_the_limit_fences_the_live_owner_before_it_dead_letters(
    switch: tuple[str, ...],
) -> None:
    # Found by the simulator (seed 281): a process past the limit dead-lettered the workflow
    # while its owner was alive, and the owner's saga refunded a charge afterwards.
    world = World()
    services = world.services
    world.ledger().workflow("wf", max_attempts=2)
    owner = world.ledger().workflow("wf")  # attempt 2: alive, slow
    owner.step("book", services.book, STAY)
    with defects.switched(switch), pytest.raises(WorkflowDeadLetteredError):
        world.ledger().workflow("wf")  # attempt 3 is past the limit
    if switch:
        assert owner.compensate("the trip was called off") == ["book"]
        assert services.effects["cancel"] == 1, "the old behaviour: an effect after the end"
        return
    with pytest.raises(WorkflowTakenOverError):
        owner.compensate("the trip was called off")
    with pytest.raises(WorkflowTakenOverError):
        owner.step("charge", services.charge, CARD)
    assert services.effects["cancel"] == 0 and services.calls["charge"] == 0
    state = replay("wf", world.log.workflow_events("wf"))
    assert state.status is RunStatus.DEAD_LETTERED and state.attempt == 3
    assert world.types("wf")[4:6] == ["workflow_resumed", "workflow_dead_lettered"]
    assert sorted(a.kind for a in state.anomalies) == ["zombie_compensation", "zombie_intent"]


def test_only_the_process_whose_claim_the_log_took_dead_letters_a_workflow() -> None:
    world = World()
    world.ledger().workflow("wf", max_attempts=1)
    late = world.ledger()
    stale = Workflow(late, "wf", late.reader.read("wf"))  # read before the other's claim
    with pytest.raises(WorkflowDeadLetteredError):
        world.ledger().workflow("wf")
    with pytest.raises(WorkflowTakenOverError):
        opening.end_past_limit(stale, 2)
    assert world.types("wf").count("workflow_dead_lettered") == 1
    assert [g.event.type for g in world.dead_letters.letters] == ["workflow_dead_lettered"]


# -- the proof by offsets ------------------------------------------------------------------


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_run_of_effectful_steps_reads_the_log_back_once(pipelined: bool) -> None:
    world = World(pipeline_outcomes=pipelined)
    ledger = world.ledger()
    reads: list[str] = []
    read_all = ledger.history.read

    def read(workflow_id: str, *, through: Position | None = None) -> History:
        reads.append(workflow_id)
        return read_all(workflow_id, through=through)

    ledger.history.read = read  # type: ignore[method-assign]
    wf = ledger.start("wf")
    for i in range(5):
        wf.step(f"charge-{i}", world.services.charge, CARD)
    assert reads == ["wf"]  # the first intent's; each later one landed right after ours
    other = factory().workflow_started("x", name="", attempt=1, read_only=False, max_attempts=5)
    world.log.append(other)
    wf.step("charge-5", world.services.charge, CARD)
    assert reads == ["wf", "wf"]  # a record of another writer came between: read back
    assert world.services.effects["charge"] == 6

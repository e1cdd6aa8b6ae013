"""A resuming agent racing the recovery daemon: one decision per in-doubt step, by log order.

In-memory, deterministic interleavings of the races found in production-like runs: the
daemon's decision lands between the agent's read and its own decision, or the other way
round.  The services count effects; every effect happens once or is compensated, and the
loser of a race never runs a hook or a retry.
"""

from __future__ import annotations

from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.errors import StepCompensatedError
from stepledger.history.protocol import History
from stepledger.kafka import Position
from stepledger.producer import Ledger
from stepledger.recovery.claims import ClaimBoard
from stepledger.resolution.claims import reader_check
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver
from tests.unit.factories import comp_key
from tests.unit.resume_fakes import World
from tests.unit.test_resume import ARGS, run_crashing, trip


def daemon(world: World, ledger: Ledger, *, confirm: bool = True) -> Resolver:
    """The recovery daemon's resolver (policy as declared: compensate the booking)."""
    return Resolver(
        world.log,
        ledger.events,
        ToolRegistry(world.services.tools()),
        clock=world.clock,
        confirm=reader_check(world.log.workflow_events) if confirm else None,
    )


def test_a_decision_the_daemon_recorded_first_is_the_one_the_resumed_agent_follows() -> None:
    """Defect 1: daemon compensates between the agent's read and the agent's own query."""
    world = World()
    run_crashing(world, ("book", "after_effect"))
    ledger = world.ledger()
    book = world.services.book
    assert book.query is not None
    query = book.query
    raced: list[bool] = []

    def query_after_the_daemon(args: dict[str, Any], key: str) -> Any:
        if not raced:
            raced.append(True)
            state = replay("wf", world.log.workflow_events("wf"))
            decided = daemon(world, ledger).resolve(state, "book")
            assert decided.status is StepStatus.COMPENSATED
        return query(args, key)  # finds the cancelled booking

    object.__setattr__(book, "query", query_after_the_daemon)
    with pytest.raises(StepCompensatedError) as caught:
        trip(ledger)
    assert caught.value.step_id == "book"
    assert caught.value.decision == "compensated"
    assert caught.value.decided_by == Source.RECOVERY_COMPENSATE.value
    # Booked once, cancelled once; never booked again, the email never sent.
    assert world.services.effects == {"charge": 1, "book": 1, "cancel": 1}
    state = replay("wf", world.log.workflow_events("wf"))
    assert state.steps["book"].status is StepStatus.COMPENSATED
    assert [a.kind for a in state.anomalies] == ["second_outcome"]


def test_a_compensation_claimed_after_the_agents_decision_runs_no_hook() -> None:
    """Defect 2: the daemon, working from a stale view, claims after the agent decided."""
    world = World()
    run_crashing(world, ("book", "after_effect"))
    ledger = world.ledger()
    stale = replay("wf", world.log.workflow_events("wf"))  # the daemon read before the resume
    wf = trip(ledger)  # the agent queries, keeps the booking, sends the email, finishes
    assert wf.state.status is RunStatus.COMPLETED
    resolution = daemon(world, ledger).attempt(stale, "book")
    assert resolution.lost
    assert resolution.step.status is StepStatus.SUCCEEDED
    assert [e.type for e in resolution.events] == ["compensation_intended"]
    assert world.services.effects == {"charge": 1, "book": 1, "email": 1}  # no cancel
    state = replay("wf", world.log.workflow_events("wf"))
    assert state.status is RunStatus.COMPLETED
    assert state.steps["book"].status is StepStatus.SUCCEEDED
    assert [a.kind for a in state.anomalies] == ["compensation_after_decision"]


def test_without_reading_its_claim_back_the_stale_daemon_would_cancel_a_kept_booking() -> None:
    """The same race with the check switched off shows what the claim read-back prevents."""
    world = World()
    run_crashing(world, ("book", "after_effect"))
    ledger = world.ledger()
    stale = replay("wf", world.log.workflow_events("wf"))
    trip(ledger)
    daemon(world, ledger, confirm=False).attempt(stale, "book")
    assert world.services.effects["cancel"] == 1


def test_two_daemons_claiming_the_same_step_compensate_once() -> None:
    world = World(forward_query=False)
    run_crashing(world, ("book", "after_effect"))
    ledger = world.ledger()
    state = replay("wf", world.log.workflow_events("wf"))
    first, second = daemon(world, ledger), daemon(world, ledger)
    assert first.claimant != second.claimant
    # Both decided from the same view; the second one's claim lands after the first's.
    won = first.attempt(replay("wf", world.log.workflow_events("wf")), "book")
    lost = second.attempt(state, "book")
    assert not won.lost and won.step.status is StepStatus.COMPENSATED
    assert lost.lost and lost.step.status is StepStatus.COMPENSATED
    assert world.services.effects == {"charge": 1, "book": 1, "cancel": 1}


def test_an_agent_call_that_outlived_its_deadline_follows_the_daemons_compensation() -> None:
    """The agent is slow, not dead: recovery compensates during the call; its outcome is late."""
    world = World()
    ledger = world.ledger()
    book = world.services.book

    def slow_book(args: dict[str, Any], key: str) -> Any:
        assert book.run is not None
        result = book.run(args, key)
        world.clock.advance(book.timeout_s + 5)  # past the intent's deadline
        daemon(world, ledger).resolve(replay("wf", world.log.workflow_events("wf")), "book")
        return result

    wf = ledger.workflow("wf", name="trip")
    wf.step("charge", world.services.charge, ARGS["charge"])
    with pytest.raises(StepCompensatedError, match="undone"):
        wf.step("book", book, ARGS["book"], slow_book)
    assert world.services.effects == {"charge": 1, "book": 1, "cancel": 1}
    assert wf.state.steps["book"].status is StepStatus.COMPENSATED


def test_a_call_that_ended_in_time_reads_nothing_back_after_it() -> None:
    world = World()
    ledger = world.ledger()
    reads: list[str] = []
    read_all = ledger.history.read

    def read(workflow_id: str, *, through: Position | None = None) -> History:
        reads.append(workflow_id)
        return read_all(workflow_id, through=through)

    ledger.history.read = read  # type: ignore[method-assign]
    wf = ledger.start("wf")
    wf.step("book", world.services.book, ARGS["book"])
    assert reads == ["wf"]  # the intent's read back before the call, nothing after it


def test_a_recovery_compensation_for_an_earlier_attempt_is_stale() -> None:
    world = World()
    f = world.ledger().events
    book = world.services.book
    claim = ev.CompensationIntended(
        idempotency_key=comp_key("wf", "s", book, attempt=1),
        reason="r",
        source=Source.RECOVERY_COMPENSATE,
        deadline=world.clock(),
    )
    events = [
        f.intent("wf", "s", book, {}, sequence=0),
        f.outcome("wf", "s", attempt=1, status=OutcomeStatus.NOT_HAPPENED),
        f.intent("wf", "s", book, {}, sequence=0, attempt=2),
        f.envelope("wf", "s", claim, "late"),
    ]
    state = replay("wf", events)
    assert state.steps["s"].status is StepStatus.INTENDED
    assert [a.kind for a in state.anomalies] == ["stale_compensation"]


def test_an_agent_compensation_needs_a_step_that_succeeded() -> None:
    world = World()
    f = world.ledger().events
    book = world.services.book
    claim = ev.CompensationIntended(
        idempotency_key=comp_key("wf", "s", book),
        reason="saga",
        source=Source.AGENT,
        deadline=world.clock(),
    )
    state = replay("wf", [f.intent("wf", "s", book, {}, sequence=0), f.envelope("wf", "s", claim)])
    assert state.steps["s"].status is StepStatus.INTENDED
    assert [a.kind for a in state.anomalies] == ["compensation_after_decision"]


def test_the_claim_board_answers_posts_made_before_the_wait_and_times_out_otherwise() -> None:
    world = World()
    f = world.ledger().events
    claim = f.envelope(
        "wf",
        "s",
        ev.CompensationIntended(
            idempotency_key="k", reason="r", source=Source.RECOVERY, deadline=world.clock()
        ),
    )
    board = ClaimBoard(timeout_s=0.05)
    state = replay("wf", [claim])
    board.post(claim.event_id, state)
    assert board.wait(claim, Position("t", 0, 0)) is state
    assert board.wait(claim, Position("t", 0, 0)) is None

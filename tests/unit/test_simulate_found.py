"""Schedules the simulator found with a second runner of every trip, pinned (shrunk).

- Seed 94, a runner paused between stamping its email intent and its append: a resuming
  agent going by the recorded times (as it did then, and still does on a log the broker
  does not stamp) abandons the step after the writer's own deadline plus the grace, but
  before the broker's append time plus the timeout.  Nothing was early:
  ``no_early_decision`` now measures the writer's budget, which began at the stamp;
  measured from the append, the replay breaks it.
- Seed 120, the recovery daemon killed between its compensation claim and the outcome:
  the restarted daemon counts the step as arrived at the take-over (one more timeout at
  most, the bound ``decided_within_bound`` states), and a late outcome the fold refused
  no longer holds the compensation back a timeout more (``refused_event_waits`` puts that
  back: the replay then passes the bound from the intent only by the take-over's
  allowance).
- Seed 281, a resume past the limit while the owner lives (``unclaimed_dead_letter``), is
  pinned with the other fixed defects: ``FIXED`` in ``test_simulate.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from unittest import mock

import pytest

from stepledger.domain import events as ev
from stepledger_dev.simulate import liveness, world
from stepledger_dev.simulate.invariants import Monitor, Violation
from stepledger_dev.simulate.plan import Plan
from stepledger_dev.simulate.scheduler import Actor
from stepledger_dev.simulate.simlog import Broker, Record

#: a1b freezes 1 s between stamping its email intent and appending it (its budget runs out
#: meanwhile, so it calls nothing); a1, back from its own pause, resumes and abandons the
#: email 654 ms after a1b's deadline, 346 ms before the append plus the timeout.
LATE_APPEND = (
    '{"seed":94,"partitions":1,"actors":[["a1","trip","w1",0,[]],["a1b","trip","w1",196,[]],'
    '["recovery","recovery","",0,[]],["checkpointer","checkpointer","",0,[]]],'
    '"faults":[[-2,"freeze","a1",2500],[20,"freeze","a1b",1000]],"turns":300,"defects":[],'
    '"agent_skew_ms":0}'
)
#: The daemon writes its compensation claim for w3's booking and is killed; a3.2, frozen
#: since it booked, writes its late "succeeded" after the restarted daemon took over.
TAKEN_OVER = (
    '{"seed":120,"partitions":2,"actors":[["a1b","trip","w1",109,[]],["a2","trip","w2",0,[]],'
    '["a2b","trip","w2",97,[]],["a3","trip","w3",0,[]],["a3b","trip","w3",63,[]],'
    '["recovery","recovery","",0,[]],["projector","projector","",0,[]],'
    '["people","people","",0,[]],["checkpointer","checkpointer","",0,[]]],'
    '"faults":[[-1,"kill","a3",1000],[14,"freeze","a3",4000],[144,"kill","recovery",1000]],'
    '"turns":600,"defects":[],"agent_skew_ms":-21807}'
)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def _by_the_append(self: Monitor, intent: Record, body: ev.StepIntended) -> int:
    """The invariant's deadline before: the intent's broker time plus its timeout."""
    assert intent.event is not None
    return intent.broker_ms + (body.deadline - intent.event.occurred_at) // timedelta(
        milliseconds=1
    )


def test_a_late_append_moves_no_writers_deadline_and_a_settling_after_it_is_not_early() -> None:
    assert not world.run(Plan.decode(LATE_APPEND)).failed
    # A resuming agent going by the recorded times (as it still does where the broker
    # stamps nothing, and did before it went by the broker's) settles between the writer's
    # deadline by its stamp and the append plus the timeout: not early.
    by_recorded = replace(Plan.decode(LATE_APPEND), defects=("resume_by_writer_clock",))
    outcome = world.run(by_recorded)
    assert not outcome.failed, [v.line() for v in outcome.violations]
    told = "\n".join(outcome.trace)
    assert "a1b        FAULT freeze 1000" in told and "a1         step_abandoned w1/email" in told
    assert "EFFECT email" not in told  # a1b's budget ran out while it was paused
    # Measured from the append instead, the same run reads as an early decision.
    with mock.patch.object(Monitor, "_deadline_ms", _by_the_append):
        before = world.run(by_recorded)
    assert before.failed and before.violations[0].invariant == "no_early_decision"
    assert "agent a1 wrote step_abandoned on email" in before.violations[0].detail


def test_a_time_a_process_recorded_goes_on_the_broker_clock_by_its_skew_then() -> None:
    actor = Actor("a", "trip", lambda a: None)
    actor.set_skew(0, -500)
    actor.set_skew(1_000, 2_000)  # its clock stepped 2.5 s forward at 1 s
    assert actor.on_broker_clock(300) == 800  # read at 0.8 s, 500 ms behind
    assert actor.on_broker_clock(3_500) == 1_500  # read at 1.5 s, 2 s ahead
    assert actor.on_broker_clock(-900) is None  # it never read that


def _bounds(line: str, switch: tuple[str, ...]) -> tuple[list[Violation], list[Violation]]:
    """The run's violations, and what the liveness check finds without the take-over
    allowance."""
    strict: list[Violation] = []
    check = liveness.check

    def both(broker: Broker, down: list[list[int]], end: int, takeovers: list[int]) -> object:
        assert takeovers, "the daemon was restarted"
        strict.extend(check(broker, down, end))
        return check(broker, down, end, takeovers)

    with mock.patch.object(liveness, "check", both):
        outcome = world.run(replace(Plan.decode(line), defects=switch))
    return outcome.violations, strict


def test_a_step_open_at_a_take_over_is_decided_within_one_more_timeout() -> None:
    found, strict = _bounds(TAKEN_OVER, ())
    assert not found and not strict, [v.line() for v in found + strict]
    # With a refused late outcome starting the compensation's wait again, the decision comes
    # past the bound from the intent, though within the take-over's allowance: the unit test
    # in test_one_clock.py guards that fix.
    # (The schedule was drawn while a resuming agent settled by the writers' recorded
    # times: its interleaving needs that back, ``resume_by_writer_clock``.)
    found, strict = _bounds(TAKEN_OVER, ("refused_event_waits", "resume_by_writer_clock"))
    assert not found
    assert [v.invariant for v in strict] == ["decided_within_bound"], strict

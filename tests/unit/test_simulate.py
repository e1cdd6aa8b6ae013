"""The deterministic simulator: a budget of seeds, exact replays, and a planted violation found,
shrunk and replayed (``stepledger simulate``, issue 43)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from click.testing import CliRunner

from stepledger.cli import cli
from stepledger.dev.simulate import explore, plan, world
from stepledger.dev.simulate.__main__ import with_defects
from stepledger.dev.simulate.shrink import shrink, story

#: Seeds CI explores on every run (docs/guarantees.md says how many).
CI_SEEDS = 250


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # The actors' own warnings (a refused record, a skipped foreign one) are the point here.
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def test_a_budget_of_seeds_breaks_no_invariant_but_the_known_open_ones() -> None:
    report = explore.explore(1, CI_SEEDS, plan.Profile())
    for failure in report.failures:
        known = failure.known.reason if failure.known else "NEW"
        print(f"seed {failure.seed}: {failure.outcome.violations[0].line()} [{known}]")
    new = [f"seed {f.seed}: {f.outcome.violations[0].line()}" for f in report.new]
    assert not new, "\n".join(new)
    assert report.seeds == CI_SEEDS


def test_a_run_replays_exactly_from_its_seed_and_schedule() -> None:
    first = world.run(explore.plan_for(7))
    again = world.run(plan.Plan.decode(first.plan.encode()))
    assert again.trace == first.trace
    assert again.ended == first.ended
    assert len(first.trace) > 20  # it did something


def test_another_seed_is_another_interleaving() -> None:
    first = world.run(explore.plan_for(7))
    other = world.run(replace(first.plan, seed=8))
    assert other.trace != first.trace


def test_a_planted_violation_is_found_shrunk_and_replayed() -> None:
    # Two live runners with the read-back taken away: both send the email.
    found = explore.first_found(20, defects=("two_live_runners",))
    assert found is not None
    shrunk = shrink(found)
    small, big = shrunk.plan, found.plan
    assert shrunk.outcome.violations[0].invariant == found.violations[0].invariant
    assert len(small.actors) + len(small.faults) < len(big.actors) + len(big.faults)
    assert small.turns <= big.turns
    replayed = world.run(plan.Plan.decode(small.encode()))
    assert replayed.violations == shrunk.outcome.violations
    assert replayed.trace == shrunk.outcome.trace
    told = "\n".join(story(replayed))
    assert "EFFECT email" in told and "starts" in told


def test_the_command_explores_seeds_and_replays_a_schedule() -> None:
    runner = CliRunner()
    explored = runner.invoke(cli, ["simulate", "--seeds", "3", "--seed", "11"])
    assert explored.exit_code == 0, explored.output
    assert "3 seeds in" in explored.output and "0 violation(s)" in explored.output
    line = explore.plan_for(11).encode()
    replayed = runner.invoke(cli, ["simulate", "--schedule", line, "--trace"])
    assert replayed.exit_code == 0, replayed.output
    assert "no violation" in replayed.output and "workflow_started" in replayed.output


def test_a_failing_schedule_replays_with_its_violation_and_only_from_the_test_entry() -> None:
    found = explore.first_found(20, defects=("two_live_runners",))
    assert found is not None
    line = found.plan.encode()
    runner = CliRunner()
    shipped = runner.invoke(cli, ["simulate", "--schedule", line])
    assert shipped.exit_code == 2 and "test-only" in shipped.output
    replayed = runner.invoke(with_defects(), ["--schedule", line])
    assert replayed.exit_code == 1
    assert found.violations[0].invariant in replayed.output


#: One agent killed after its first outcome, its partition's head deleted while it is down,
#: and another deployment's checkpoints (same step log name and workflow ids) in the topic.
RETAINED = (
    '{"seed":5,"partitions":1,"actors":[["a1","paynotify","w1",0,[]],'
    '["checkpointer","checkpointer","",0,[]],["other","other","",0,[]]],'
    '"faults":[[-101,"kill","a1",3000],[60,"retention","w1",0]],"turns":300,"defects":[]}'
)


def test_a_resume_after_retention_reads_its_history_from_its_own_logs_checkpoint() -> None:
    outcome = world.run(plan.Plan.decode(RETAINED))
    trace = "\n".join(outcome.trace)
    assert not outcome.failed, outcome.violations
    assert "p0 now starts at 3" in trace  # the intent and outcome of the capture are gone
    assert "workflow_resumed w1/- attempt 2" in trace  # ... yet the resume knew them
    assert trace.count("EFFECT capture") == 1 and outcome.ended["a1.2"] == "completed"


#: Found by the simulator (an open defect until the daemon learned claims it did not know):
#: the daemon killed after it checkpointed past w1's resume, with none of w1's steps tracked
#: then; the first runner, fenced off, writes its intent for 'book' after the restart.
RESTARTED_PAST_A_CLAIM = (
    '{"seed":152,"partitions":1,"actors":[["a1","trip","w1",0,[]],'
    '["a1b","trip","w1",112,[]],["a2","trip","w2",0,[]],["a2b","trip","w2",100,[]],'
    '["a3","trip","w3",0,[]],["recovery","recovery","",0,[]],'
    '["projector","projector","",0,[]],["people","people","",0,[]]],'
    '"faults":[[112,"kill","recovery",1000]],"turns":600,"defects":[],"agent_skew_ms":0}'
)


def test_a_daemon_restarted_past_a_claim_decides_nothing_on_a_fenced_off_intent() -> None:
    outcome = world.run(plan.Plan.decode(RESTARTED_PAST_A_CLAIM))
    trace = "\n".join(outcome.trace)
    assert not outcome.failed, [v.line() for v in outcome.violations]
    assert "recovery.2 starts" in trace  # the restart happened, and after it ...
    assert "step_intended w1/book bookings.book attempt 1 epoch 1" in trace  # the zombie wrote
    assert "EFFECT cancel w1/book" not in trace
    assert "compensation_intended w1/book" not in trace

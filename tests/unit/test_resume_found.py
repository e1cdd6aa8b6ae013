"""A query that finds the effect settles an in-doubt step before its deadline; nothing else does.

Over the in-memory log: each resume comes "right after the crash" (the clock set back so
the intent's deadline is still ahead) with a tiny ``resolve_timeout_s``, so a resume that
waits for the deadline raises StepInDoubtError instead of sleeping.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import EffectClass, OutcomeStatus, ResolutionPolicy, Source
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import StepInDoubtError
from stepledger.producer import Ledger
from tests.unit.resume_fakes import Crash, World, crash_after


def crash_in(world: World, tool: Tool, args: dict[str, Any], *, effect: bool) -> None:
    wf = world.ledger().workflow("wf")
    with pytest.raises(Crash):
        wf.step("s", tool, args, crash_after(tool, effect=effect))


def right_after_the_crash(world: World, **options: Any) -> Ledger:
    ledger = world.ledger(**options)
    world.clock.advance(-60)  # the intent's deadline (1 s) is still ahead
    return ledger


def test_a_found_charge_settles_at_once_with_the_query_as_evidence() -> None:
    world = World(resolve_timeout_s=0.05)
    svc = world.services
    crash_in(world, svc.charge, {"amount": 5}, effect=True)
    wf = right_after_the_crash(world).workflow("wf")
    assert wf.state.steps["s"].status is StepStatus.SUCCEEDED  # settled while opening
    assert wf.step("s", svc.charge, {"amount": 5})["amount"] == 5
    assert svc.effects["charge"] == 1 and svc.calls["charge"] == 1
    outcome = next(e for e in world.log.workflow_events("wf") if e.type == "step_outcome")
    assert isinstance(outcome.body, ev.StepOutcome)
    assert outcome.body.source is Source.RECOVERY_QUERY
    assert json.loads(outcome.body.evidence_json or "{}")["before_due"] is True


def test_not_found_before_the_deadline_records_nothing_and_waits() -> None:
    world = World(resolve_timeout_s=0.05)
    svc = world.services
    crash_in(world, svc.charge, {"amount": 5}, effect=False)
    before = world.types("wf")
    ledger = right_after_the_crash(world)
    with pytest.raises(StepInDoubtError, match="still in doubt"):
        ledger.workflow("wf")
    assert world.types("wf") == [*before, "workflow_resumed"]  # no attempt, no decision
    assert svc.calls["charge"] == 0
    wf = world.ledger().workflow("wf")  # past the deadline: not found -> not happened
    wf.step("s", svc.charge, {"amount": 5})
    assert svc.effects["charge"] == 1


def test_a_found_booking_is_kept_not_cancelled_and_without_forward_query_it_waits() -> None:
    world = World(resolve_timeout_s=0.05)
    svc = world.services
    crash_in(world, svc.book, {"hotel": "h"}, effect=True)
    with pytest.raises(StepInDoubtError):
        right_after_the_crash(world, forward_query=False).workflow("wf")  # policy compensate
    wf = right_after_the_crash(world).workflow("wf")
    assert wf.state.steps["s"].status is StepStatus.SUCCEEDED
    assert svc.effects == {"book": 1}


def test_a_redrive_tool_with_a_query_hook_still_waits_for_the_deadline() -> None:
    world = World(resolve_timeout_s=0.05)
    asked: list[str] = []
    tool = replace_policy(world.services.charge, ResolutionPolicy.REDRIVE, asked)
    crash_in(world, tool, {"amount": 5}, effect=True)
    with pytest.raises(StepInDoubtError):
        Ledger(
            world.ledger().settings,
            log=world.log,
            clock=lambda: world.clock.now - timedelta(seconds=59.5),
            tools=[tool],
            options=world.options,
        ).workflow("wf")
    assert asked == []  # a re-drive is not a query: nothing asked before the deadline


@pytest.mark.parametrize("hook", ["raises", "hangs"])
def test_a_failing_or_hanging_query_before_the_deadline_records_nothing(hook: str) -> None:
    world = World(resolve_timeout_s=0.3)
    tool = Tool(
        name="pay", effect=EffectClass.IDEMPOTENT, keyed=True, policy="query",
        timeout_s=10, run=lambda a, k: 1, query=_raises if hook == "raises" else _hangs,
    )  # fmt: skip
    wf = world.ledger(tools=False).workflow("wf")
    with pytest.raises(Crash):
        wf.step("s", tool, {}, crash_after(tool, effect=False))
    before = world.types("wf")
    ledger = Ledger(
        wf.ledger.settings,
        log=world.log,
        clock=lambda: world.clock.now + timedelta(seconds=9.5),  # due in 0.5 s
        tools=[tool],
        options=world.options,
    )
    began = time.monotonic()
    with pytest.raises(StepInDoubtError):
        ledger.workflow("wf")
    # Bounded by the time left until the step is due (0.5 s), not by the hook's 10 s timeout:
    # the hanging hook's late "found" is never recorded.
    assert time.monotonic() - began < 2.5
    assert world.types("wf") == [*before, "workflow_resumed"]


def test_the_agents_late_outcome_after_a_found_query_is_superseded_not_a_conflict() -> None:
    world = World(resolve_timeout_s=0.05)
    svc = world.services
    crash_in(world, svc.charge, {"amount": 5}, effect=True)
    right_after_the_crash(world).workflow("wf")
    intent = next(e for e in world.log.workflow_events("wf") if e.type == "step_intended")
    late = world.ledger().events.outcome(
        "wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"amount": 5}
    )
    state = replay("wf", [*world.log.workflow_events("wf"), late])
    step = state.steps["s"]
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.RECOVERY_QUERY
    assert isinstance(late.body, ev.StepOutcome) and isinstance(intent.body, ev.StepIntended)
    assert rs.judge_late_outcome(step, late.body) is rs.LateVerdict.SUPERSEDED
    assert intent.body.idempotency_key in svc.charges


def test_query_before_due_only_for_intended_steps_whose_due_decision_is_a_query() -> None:
    world = World()
    svc = world.services
    crash_in(world, svc.charge, {"amount": 5}, effect=False)
    step = replay("wf", world.log.workflow_events("wf")).steps["s"]
    assert step.deadline is not None
    early, due = step.deadline - timedelta(seconds=0.5), step.deadline
    action = rs.query_before_due(step, svc.charge, now=early)
    assert action is not None and action.kind is rs.ActionKind.QUERY and action.due_at == due
    assert rs.query_before_due(step, svc.charge, now=due) is None  # due: the usual path
    assert rs.query_before_due(step, None, now=early) is None
    assert rs.query_before_due(step, svc.email, now=early) is None  # no query hook
    compensating = replace(step, status=StepStatus.COMPENSATING)
    assert rs.query_before_due(compensating, svc.charge, now=early) is None


def replace_policy(tool: Tool, policy: ResolutionPolicy, asked: list[str]) -> Tool:
    def query(args: dict[str, Any], key: str) -> Found | NotFound:
        asked.append(key)
        assert tool.query is not None
        return tool.query(args, key)

    return Tool(
        name=tool.name, effect=EffectClass.IDEMPOTENT, keyed=True, policy=policy,
        timeout_s=1, run=tool.run, redrive=tool.run, query=query,
    )  # fmt: skip


def _raises(args: dict[str, Any], key: str) -> Found:
    raise RuntimeError("the service is down")


def _hangs(args: dict[str, Any], key: str) -> Found:
    time.sleep(3)
    return Found(1)

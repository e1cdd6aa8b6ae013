"""Resume over the in-memory log: replay without calling tools, settle what is in doubt."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import EffectClass, Source, Verdict
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import (
    LedgerStateError,
    PlanMismatchError,
    StepInDoubtError,
    ToolCallError,
    WorkflowDeadLetteredError,
)
from stepledger.producer import Ledger, Workflow
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver
from tests.unit.resume_fakes import Crash, World, crash_after

ARGS: dict[str, dict[str, Any]] = {
    "read": {"q": "flights"},
    "charge": {"amount": 120},
    "book": {"hotel": "Ritz"},
    "email": {"to": "a@example.test"},
}


def trip(ledger: Ledger, wf_id: str = "wf", *, crash: tuple[str, str] | None = None) -> Workflow:
    """read -> charge -> book -> email -> finish; ``crash`` = (step, point) dies there.

    Points: ``before_intent``, ``after_intent`` (no effect), ``after_effect`` (no outcome).
    """
    svc_tools = {t.name: t for t in ledger.tools}
    wf = ledger.workflow(wf_id, name="trip")
    for step_id in ("read", "charge", "book", "email"):
        tool = svc_tools[step_id]
        point = crash[1] if crash and crash[0] == step_id else None
        if point == "before_intent":
            raise Crash()
        fn = crash_after(tool, effect=point == "after_effect") if point else None
        wf.step(step_id, tool, ARGS[step_id], fn)
    wf.finish()
    return wf


def run_crashing(world: World, crash: tuple[str, str], wf_id: str = "wf") -> None:
    with pytest.raises(Crash):
        trip(world.ledger(), wf_id, crash=crash)


def test_recorded_steps_return_their_results_without_calling_the_tools() -> None:
    world = World()
    run_crashing(world, ("email", "before_intent"))
    assert world.services.calls == {"read": 1, "charge": 1, "book": 1}
    wf = trip(world.ledger())
    svc = world.services
    assert svc.calls == {"read": 1, "charge": 1, "book": 1, "email": 1}
    assert svc.effects == {"charge": 1, "book": 1, "email": 1}
    assert wf.state.status is RunStatus.COMPLETED and wf.attempt == 2
    resumed = [e.body for e in world.log.workflow_events("wf") if e.type == "workflow_resumed"]
    assert [b.attempt for b in resumed if isinstance(b, ev.WorkflowResumed)] == [2]


@pytest.mark.parametrize("step", ["charge", "book"])
@pytest.mark.parametrize("effect", [False, True])
def test_in_doubt_steps_are_resolved_and_effects_happen_once(step: str, effect: bool) -> None:
    world = World()
    run_crashing(world, (step, "after_effect" if effect else "after_intent"))
    wf = trip(world.ledger())
    assert wf.state.status is RunStatus.COMPLETED
    assert world.services.effects == {"charge": 1, "book": 1, "email": 1}
    settled = wf.state.steps[step]
    assert settled.status is StepStatus.SUCCEEDED
    # An effect that never happened is found missing and done again under a new attempt.
    assert settled.attempt == (1 if effect or step == "charge" else 2)


def test_resume_resolves_with_the_recovery_resolver_events() -> None:
    world = World()
    run_crashing(world, ("charge", "after_effect"))
    trip(world.ledger())
    charge = [e for e in world.log.workflow_events("wf") if e.step_id == "charge"]
    kinds = [e.type for e in charge]
    assert kinds == ["step_intended", "resolution_attempted", "step_outcome"]
    outcome = charge[-1].body
    assert isinstance(outcome, ev.StepOutcome) and outcome.source is Source.RECOVERY_QUERY


def test_without_forward_query_a_compensatable_step_in_doubt_is_compensated() -> None:
    world = World(forward_query=False)
    run_crashing(world, ("book", "after_effect"))
    with pytest.raises(LedgerStateError, match="undone"):
        trip(world.ledger())
    assert world.services.effects == {"charge": 1, "book": 1, "cancel": 1}


def test_an_irreversible_step_in_doubt_is_escalated_then_a_human_decides() -> None:
    world = World()
    run_crashing(world, ("email", "after_intent"))
    with pytest.raises(StepInDoubtError) as raised:
        trip(world.ledger())
    escalation = raised.value.escalation_id
    assert escalation and escalation.startswith("esc-")
    assert world.services.effects["email"] == 0
    human = ev.EscalationResolved(escalation_id=escalation, verdict=Verdict.NOT_HAPPENED, by="ops")
    world.log.append(world.ledger().events.envelope("wf", "email", human))
    wf = trip(world.ledger())
    assert wf.state.status is RunStatus.COMPLETED
    assert world.services.effects["email"] == 1 and wf.state.steps["email"].attempt == 2


def test_an_escalated_email_that_happened_is_not_sent_again() -> None:
    world = World()
    run_crashing(world, ("email", "after_effect"))
    with pytest.raises(StepInDoubtError) as raised:
        trip(world.ledger())
    human = ev.EscalationResolved(
        escalation_id=str(raised.value.escalation_id), verdict=Verdict.HAPPENED, by="ops"
    )
    world.log.append(world.ledger().events.envelope("wf", "email", human))
    trip(world.ledger())
    assert world.services.effects["email"] == 1


def test_a_step_in_doubt_before_its_deadline_waits_and_then_gives_up() -> None:
    world = World(resolve_timeout_s=0.05)
    run_crashing(world, ("charge", "after_intent"))
    ledger = world.ledger()
    world.clock.advance(-60)  # the resume comes right after the crash: the deadline is ahead
    with pytest.raises(StepInDoubtError, match="still in doubt"):
        trip(ledger)
    assert world.services.calls["charge"] == 0


def test_a_replayed_plan_asking_for_another_step_is_reported() -> None:
    world = World()
    run_crashing(world, ("book", "after_intent"))
    ledger = world.ledger()
    wf = ledger.workflow("wf")
    wf.step("read", world.services.read, ARGS["read"])
    with pytest.raises(PlanMismatchError, match=r"position 1.*'charge'"):
        wf.step("lookup", world.services.read, {"q": "other"})


def test_a_replayed_step_with_other_arguments_is_reported() -> None:
    world = World()
    run_crashing(world, ("book", "after_intent"))
    wf = world.ledger().workflow("wf")
    wf.step("read", world.services.read, ARGS["read"])
    with pytest.raises(PlanMismatchError, match="recorded as another call"):
        wf.step("charge", world.services.charge, {"amount": 999})
    assert world.services.calls["charge"] == 1


def test_a_recorded_failure_is_raised_again_and_a_second_call_retries() -> None:
    world = World()
    calls: list[str] = []

    def declined(args: dict[str, Any], key: str) -> Any:
        calls.append(key)
        raise ValueError("card declined")

    wf = world.ledger().workflow("wf")
    with pytest.raises(ValueError):
        wf.step("charge", world.services.charge, ARGS["charge"], declined)
    wf = world.ledger().workflow("wf")
    with pytest.raises(ToolCallError, match="card declined"):
        wf.step("charge", world.services.charge, ARGS["charge"], declined)
    assert len(calls) == 1
    result = wf.step("charge", world.services.charge, ARGS["charge"])
    assert wf.state.steps["charge"].attempt == 2 and result["charge"].endswith("-a2")


def test_resumes_past_the_limit_dead_letter_the_workflow_until_cleared() -> None:
    world = World()
    world.ledger().workflow("wf", max_attempts=2)
    world.ledger().workflow("wf")
    with pytest.raises(WorkflowDeadLetteredError, match="workflows clear wf") as raised:
        world.ledger().workflow("wf")
    escalation = raised.value.escalation_id
    assert world.types("wf")[-1] == "workflow_dead_lettered"
    assert [g.event.type for g in world.dead_letters.letters] == ["workflow_dead_lettered"]
    count = len(world.log.events)
    with pytest.raises(WorkflowDeadLetteredError):
        world.ledger().workflow("wf")
    assert len(world.log.events) == count, "a refused resume records nothing"
    cleared = ev.EscalationResolved(
        escalation_id=str(escalation), verdict=Verdict.CLEARED, by="ops"
    )
    world.log.append(world.ledger().events.envelope("wf", None, cleared))
    wf = world.ledger().workflow("wf")
    # Attempt 3 was claimed to dead-letter the workflow: the run after the clear is 4.
    assert wf.state.status is RunStatus.RUNNING and wf.attempt == 4


def test_a_read_only_workflow_starts_over_and_recovery_leaves_it_alone() -> None:
    world = World()
    read = world.services.read
    ledger = world.ledger()
    wf = ledger.workflow("wf", read_only=True)
    wf.step("a", read, {"q": 1})
    with pytest.raises(Crash):
        wf.step("b", read, {"q": 2}, crash_after(read, effect=False))
    resolver = Resolver(world.log, ledger.events, ToolRegistry([read]), clock=world.clock)
    state = replay("wf", world.log.workflow_events("wf"))
    assert resolver.decide(state, "b").kind is rs.ActionKind.NONE
    wf = world.ledger().workflow("wf", read_only=True)
    assert wf.state.steps == {} and wf.attempt == 2
    wf.step("a", read, {"q": 1})
    wf.step("b", read, {"q": 2})
    assert world.services.calls["read"] == 3
    assert world.types("wf").count("workflow_started") == 2
    assert "workflow_resumed" not in world.types("wf")


def test_an_effectful_tool_is_refused_in_a_read_only_workflow() -> None:
    world = World()
    wf = world.ledger().workflow("wf", read_only=True)
    with pytest.raises(LedgerStateError, match="read-only"):
        wf.step("charge", world.services.charge, ARGS["charge"])
    assert world.services.calls["charge"] == 0


def test_a_read_only_step_in_doubt_runs_again_under_its_intent() -> None:
    world = World()
    run_crashing(world, ("read", "after_intent"))
    wf = trip(world.ledger())
    read_events = [e for e in world.log.workflow_events("wf") if e.step_id == "read"]
    assert [e.type for e in read_events] == ["step_intended", "step_outcome"]
    assert wf.state.steps["read"].attempt == 1 and world.services.calls["read"] == 1


def test_waiting_for_recovery_takes_the_daemons_decision() -> None:
    world = World(wait_for_recovery=True, resolve_timeout_s=5.0)
    run_crashing(world, ("charge", "after_effect"))
    ledger = world.ledger()
    state = replay("wf", world.log.workflow_events("wf"))
    # The 'daemon' decides first, from its own resolver; the resume only waits for it.
    Resolver(world.log, ledger.events, ledger.tools, clock=world.clock).resolve(state, "charge")
    wf = trip(ledger)
    charge = wf.state.steps["charge"]
    assert charge.status is StepStatus.SUCCEEDED and charge.resolved_by is Source.RECOVERY_QUERY
    assert world.services.effects["charge"] == 1


def test_waiting_for_recovery_gives_up_with_a_clear_error() -> None:
    world = World(wait_for_recovery=True, resolve_timeout_s=0.05)
    run_crashing(world, ("charge", "after_effect"))
    with pytest.raises(StepInDoubtError, match="no recovery decision"):
        trip(world.ledger())


def test_a_finished_workflow_replays_and_runs_nothing_new() -> None:
    world = World()
    trip(world.ledger())
    wf = trip(world.ledger())
    assert world.services.calls == {"read": 1, "charge": 1, "book": 1, "email": 1}
    assert "workflow_resumed" not in world.types("wf")
    with pytest.raises(LedgerStateError, match="completed"):
        wf.step("extra", world.services.read, {})


def test_context_is_rebuilt_from_the_log_after_a_resume() -> None:
    world = World()
    run_crashing(world, ("email", "after_intent"))
    wf = world.ledger(tools=False).workflow("wf")
    context = wf.context()
    assert [(s.step_id, s.status) for s in context[:3]] == [
        ("read", StepStatus.SUCCEEDED),
        ("charge", StepStatus.SUCCEEDED),
        ("book", StepStatus.SUCCEEDED),
    ]
    assert context[1].arguments == ARGS["charge"] and context[2].result["hotel"] == "Ritz"
    assert context[3].step_id == "email" and context[3].status is StepStatus.INTENDED


def test_unknown_tools_are_settled_when_the_agent_asks_for_the_step() -> None:
    world = World()
    run_crashing(world, ("charge", "after_effect"))
    ledger = world.ledger(tools=False)
    wf = ledger.workflow("wf")
    assert wf.state.steps["charge"].in_doubt, "no registry: nothing settled on entry"
    wf.step("read", world.services.read, ARGS["read"])
    result = wf.step("charge", world.services.charge, ARGS["charge"])
    assert json.dumps(result) and world.services.effects["charge"] == 1


def test_async_steps_replay_too() -> None:
    import asyncio

    world = World()
    run_crashing(world, ("book", "after_effect"))

    async def agent() -> Workflow:
        ledger = world.ledger()
        wf = ledger.workflow("wf")
        for step_id in ("read", "charge", "book", "email"):
            tool = ledger.tools.require(step_id)
            await wf.astep(step_id, tool, ARGS[step_id])
        return wf

    wf = asyncio.run(agent())
    assert world.services.effects == {"charge": 1, "book": 1, "email": 1}
    assert wf.state.steps["email"].effect is EffectClass.IRREVERSIBLE


@pytest.mark.parametrize("did_effect", [True, False], ids=["effect-happened", "no-effect"])
def test_a_timeout_leaves_the_step_in_doubt_and_a_retry_never_doubles_the_effect(
    did_effect: bool,
) -> None:
    """A call that times out may have charged: no 'failed' outcome, the policy decides."""
    world = World()
    charge = world.services.charge

    def timing_out(args: dict[str, Any], key: str) -> Any:
        if did_effect:
            assert charge.run is not None
            charge.run(args, key)
        raise TimeoutError("read timed out")

    ledger = world.ledger()
    wf = ledger.workflow("wf-timeout", name="t")
    with pytest.raises(StepInDoubtError, match="effect is unknown"):
        wf.step("charge", charge, ARGS["charge"], timing_out)
    assert world.types("wf-timeout")[-1] == "step_intended"
    retried = world.ledger().workflow("wf-timeout", name="t")
    result = retried.step("charge", charge, ARGS["charge"])
    assert world.services.effects["charge"] == 1
    assert result["amount"] == 120
    assert "failed" not in json.dumps([e.model_dump(mode="json") for e in world.log.events])


@pytest.mark.parametrize("run_async", [False, True], ids=["step", "astep"])
def test_a_read_only_call_that_times_out_is_failed_not_left_open(run_async: bool) -> None:
    """A read has no effect to be in doubt about, and recovery never settles its intent:
    left open, the step stayed ``intended`` for good (the chaos run's
    every_intent_resolved_or_escalated)."""
    world = World()
    lookup = Tool(name="lookup", effect="read_only")

    def timing_out(args: dict[str, Any], key: str) -> Any:
        raise TimeoutError("read timed out")

    wf = world.ledger().workflow("wf-read-timeout", name="t")
    with pytest.raises(TimeoutError, match="read timed out"):
        if run_async:
            asyncio.run(wf.astep("lookup", lookup, {"q": 1}, timing_out))
        else:
            wf.step("lookup", lookup, {"q": 1}, timing_out)
    state = replay("wf-read-timeout", world.log.workflow_events("wf-read-timeout"))
    assert state.steps["lookup"].status is StepStatus.FAILED
    assert world.types("wf-read-timeout")[-1] == "step_outcome"
    again = world.ledger().workflow("wf-read-timeout", name="t")
    with pytest.raises(ToolCallError, match="failed before: read timed out"):
        again.step("lookup", lookup, {"q": 1}, lambda args, key: "found")  # as any failure


def test_a_definite_tool_error_is_recorded_as_failed() -> None:
    world = World()

    def declined(args: dict[str, Any], key: str) -> Any:
        raise ValueError("card declined")

    wf = world.ledger().workflow("wf-declined", name="t")
    with pytest.raises(ValueError, match="declined"):
        wf.step("charge", world.services.charge, ARGS["charge"], declined)
    state = replay("wf-declined", world.log.workflow_events("wf-declined"))
    assert state.steps["charge"].status is StepStatus.FAILED

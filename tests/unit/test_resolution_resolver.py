"""The Resolver against the in-memory event log: every decision recorded, ids deterministic."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain.enums import CompensationStatus, OutcomeStatus, Source, Verdict
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, WorkflowState, replay
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import HookTimeoutError, RecoveryError
from stepledger.humanqueue.escalations import EscalationQueue, answer
from stepledger.log import InMemoryEventLog
from stepledger.resolution import MemoryEventLetters, Resolver, ToolRegistry
from stepledger.resolution.hooks import HookPool
from tests.unit.factories import Clock

ARGS = {"amount": 5, "customer": "c"}


class Service:
    """An in-process stand-in for a keyed service, counting effects per key."""

    def __init__(self) -> None:
        self.effects: dict[str, int] = {}
        self.calls: list[str] = []

    def run(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.calls.append("run")
        self.effects[key] = self.effects.get(key, 0) or 1
        return {"charged": key}

    def query(self, args: dict[str, Any], key: str) -> Found | NotFound:
        self.calls.append("query")
        return Found({"charged": key}) if key in self.effects else NotFound("none")

    def cancel(self, args: dict[str, Any], key: str, known: Any) -> Any:
        self.calls.append("cancel")
        if self.effects.pop(key, None) is None:
            return NotFound("nothing to undo")
        return {"cancelled": key}


class Setup:
    def __init__(self, tool: Tool, *, fleet: str = "fleet") -> None:
        self.clock = Clock()
        self.agent = EventFactory(fleet, "agent", self.clock)
        self.log = InMemoryEventLog()
        self.letters = MemoryEventLetters()
        self.tool = tool
        self.resolver = Resolver(
            self.log,
            EventFactory("recovery-fleet", "recovery", self.clock),
            ToolRegistry([tool]),
            dead_letters=self.letters,
            clock=self.clock,
            retry_base_s=0.01,
        )
        self.state = WorkflowState("wf")
        self.record(self.agent.intent("wf", "s", tool, ARGS, sequence=0))

    def record(self, event: ev.Event) -> None:
        self.log.append(event)
        self.state.apply(event)

    def past_deadline(self, seconds: float = 1.0) -> None:
        self.clock.now += timedelta(seconds=self.tool.timeout_s + seconds)

    def types(self) -> list[str]:
        return [e.type for e in self.log.events[1:]]


def pay(service: Service, **kw: Any) -> Tool:
    return Tool(
        name="pay",
        effect="idempotent",
        keyed=True,
        policy="query",
        query=service.query,
        run=service.run,
        timeout_s=1,
        **kw,
    )


def test_not_due_changes_nothing() -> None:
    setup = Setup(pay(Service()))
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.INTENDED and setup.types() == []


def test_query_found_appends_outcome_with_evidence() -> None:
    service = Service()
    setup = Setup(pay(service))
    key = setup.state.steps["s"].idempotency_key
    service.run(ARGS, key)
    setup.past_deadline()
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.RECOVERY_QUERY
    assert setup.types() == ["resolution_attempted", "step_outcome"]
    outcome = setup.log.events[-1].body
    assert isinstance(outcome, ev.StepOutcome) and outcome.evidence_json is not None
    assert '"found":true' in outcome.evidence_json
    assert setup.log.events[-1].fleet_id == "fleet"  # the workflow's fleet, not the daemon's


def test_a_decision_keeps_its_id_and_its_workflows_fleet_across_workflows() -> None:
    """One id per decided attempt (query or re-drive alike, so two resolvers write one
    event); each fleet's factory is made once and every decision carries its own fleet."""
    service = Service()
    setup = Setup(pay(service))
    other = WorkflowState("wf-2")
    intent = EventFactory("fleet-b", "agent", setup.clock).intent(
        "wf-2", "s", setup.tool, ARGS, sequence=0
    )
    setup.log.append(intent)
    other.apply(intent)
    setup.past_deadline()
    setup.resolver.resolve(setup.state, "s")
    setup.resolver.resolve(other, "s")
    outcomes = [e for e in setup.log.events if e.type == "step_outcome"]
    assert [e.event_id for e in outcomes] == [
        ids.event_id(wf, "s", "step_outcome", 1, "recovery") for wf in ("wf", "wf-2")
    ]
    assert [e.fleet_id for e in outcomes] == ["fleet", "fleet-b"]
    made = setup.resolver._factory(other)
    assert made is setup.resolver._factory(other) and made.fleet_id == "fleet-b"


def test_query_not_found_is_not_happened_without_a_redrive_hook() -> None:
    setup = Setup(pay(Service()))
    setup.past_deadline()
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.NOT_HAPPENED and step.resolved_by is Source.RECOVERY_QUERY


def test_query_not_found_redrives_with_the_same_key_when_declared() -> None:
    service = Service()
    setup = Setup(pay(service, redrive=service.run))
    setup.past_deadline()
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.RECOVERY_REDRIVE
    assert service.effects == {step.idempotency_key: 1}
    assert setup.types() == ["resolution_attempted", "resolution_attempted", "step_outcome"]


def test_compensate_records_intent_and_outcome_and_tolerates_nothing_to_undo() -> None:
    service = Service()
    book = Tool(
        name="book", effect="compensatable", keyed=True, compensate=service.cancel, timeout_s=1
    )
    setup = Setup(book)
    setup.past_deadline()
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.COMPENSATED
    assert setup.types() == [
        "compensation_intended",
        "resolution_attempted",
        "compensation_outcome",
    ]
    intended, _, done = setup.log.events[1:]
    assert isinstance(intended.body, ev.CompensationIntended)
    assert intended.body.idempotency_key == ids.compensation_key(step.idempotency_key)
    assert isinstance(done.body, ev.CompensationOutcome)
    assert done.body.status is CompensationStatus.NOTHING_TO_UNDO


def test_escalate_abandons_into_the_queue_with_probe_evidence() -> None:
    service = Service()
    mail = Tool(name="mail", effect="irreversible", query=service.query, timeout_s=1)
    setup = Setup(mail)
    setup.past_deadline()
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.ABANDONED and step.escalation_open
    assert step.escalation_id == ids.escalation_id("wf", "s", "policy", 1)
    assert setup.types() == ["resolution_attempted", "step_abandoned"]
    [item] = EscalationQueue().extend(setup.log.events).open()
    assert item.evidence["probe"] == {"found": False, "detail": "none"}
    assert item.arguments == ARGS and len(item.probes) == 1


def test_failing_hook_counts_attempts_then_gives_up_and_dead_letters() -> None:
    def broken(args: dict[str, Any], key: str) -> Found:
        raise ConnectionError("service down")

    tool = Tool(
        name="pay",
        effect="idempotent",
        keyed=True,
        policy="query",
        query=broken,
        timeout_s=1,
        max_attempts=3,
    )
    setup = Setup(tool)
    setup.past_deadline()
    for attempt in (1, 2, 3):
        setup.clock.now += timedelta(seconds=5)
        step = setup.resolver.resolve(setup.state, "s")
        assert step.status is StepStatus.INTENDED and step.recovery_attempts == attempt
    setup.clock.now += timedelta(seconds=5)
    step = setup.resolver.resolve(setup.state, "s")
    assert step.status is StepStatus.ABANDONED
    assert step.escalation_id == ids.escalation_id("wf", "s", "exhausted", 1)
    [letter] = setup.letters.letters
    assert letter.event.type == "step_abandoned" and "3 recovery attempts" in letter.reason
    errors = [e.body.error for e in setup.log.events if isinstance(e.body, ev.ResolutionAttempted)]
    assert errors == ["ConnectionError: service down"] * 3
    assert setup.resolver.resolve(setup.state, "s").status is StepStatus.ABANDONED
    assert len(setup.letters.letters) == 1


def test_a_hung_hook_is_bounded_by_the_tool_timeout() -> None:
    def hang(args: dict[str, Any], key: str) -> Found:
        time.sleep(5)
        return Found()

    tool = Tool(
        name="pay", effect="idempotent", keyed=True, policy="query", query=hang, timeout_s=0.2
    )
    setup = Setup(tool)
    setup.past_deadline()
    began = time.monotonic()
    resolution = setup.resolver.attempt(setup.state, "s")
    assert time.monotonic() - began < 1.0
    assert resolution.error is not None and "HookTimeoutError" in resolution.error
    assert resolution.step.recovery_attempts == 1 and resolution.step.in_doubt


@pytest.mark.parametrize("policy", ["redrive", "query"])
def test_two_resolvers_racing_on_a_step_write_the_same_event_ids(policy: str) -> None:
    service = Service()
    tool = Tool(
        name="pay",
        effect="idempotent",
        keyed=True,
        policy=policy,
        query=service.query,
        run=service.run,
        timeout_s=1,
    )
    setup = Setup(tool)
    setup.past_deadline()
    copy = replay("wf", list(setup.log.events))
    first = setup.resolver.attempt(setup.state, "s")
    second = setup.resolver.attempt(copy, "s")
    assert first.events and [e.event_id for e in first.events] == [
        e.event_id for e in second.events
    ]
    assert all(n <= 1 for n in service.effects.values())
    merged = replay("wf", list(setup.log.events))
    assert merged.steps["s"].status is first.step.status and not merged.anomalies


def test_conflicting_late_outcome_opens_an_escalation_and_a_verdict_rejudges() -> None:
    setup = Setup(pay(Service()))
    setup.past_deadline()
    assert setup.resolver.resolve(setup.state, "s").status is StepStatus.NOT_HAPPENED
    late = setup.agent.outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, result=1)
    setup.record(late)
    assert [a.kind for a in setup.state.anomalies] == ["late_outcome"]
    resolution = setup.resolver.judge_late(setup.state, late)
    assert [e.type for e in resolution.events] == ["anomaly_observed", "step_abandoned"]
    step = resolution.step
    assert step.status is StepStatus.NOT_HAPPENED and step.escalation_open
    [item] = EscalationQueue().extend(setup.log.events).open()
    assert item.escalation_id == ids.escalation_id("wf", "s", "conflict", 1)
    event = answer(setup.log, setup.agent, item, Verdict.HAPPENED, by="ana", result={"id": 1})
    setup.state.apply(event)
    assert setup.state.steps["s"].status is StepStatus.SUCCEEDED
    assert not setup.state.steps["s"].escalation_open
    assert EscalationQueue().extend(setup.log.events).open() == []


def test_superseded_late_outcome_is_recorded_and_the_decision_stands() -> None:
    service = Service()
    setup = Setup(pay(service, redrive=service.run))
    setup.past_deadline()
    setup.resolver.resolve(setup.state, "s")
    late = setup.agent.outcome("wf", "s", attempt=1, status=OutcomeStatus.FAILED, error="timeout")
    setup.record(late)
    resolution = setup.resolver.judge_late(setup.state, late)
    [anomaly] = resolution.events
    assert isinstance(anomaly.body, ev.AnomalyObserved)
    assert anomaly.body.kind == "late_outcome_superseded"
    assert resolution.step.status is StepStatus.SUCCEEDED and not resolution.step.escalation_open


def test_answer_refuses_a_verdict_the_escalation_does_not_take() -> None:
    mail = Tool(name="mail", effect="irreversible", timeout_s=1)
    setup = Setup(mail)
    setup.past_deadline()
    setup.resolver.resolve(setup.state, "s")
    [item] = EscalationQueue().extend(setup.log.events).open()
    with pytest.raises(Exception, match="takes happened"):
        answer(setup.log, setup.agent, item, Verdict.CLEARED, by="ana")


def test_unknown_step_is_a_recovery_error() -> None:
    setup = Setup(pay(Service()))
    with pytest.raises(RecoveryError):
        setup.resolver.resolve(setup.state, "nope")


def test_hook_pool_bounds_threads_and_never_starts_a_call_it_gave_up() -> None:
    pool = HookPool(size=1)
    release = threading.Event()
    ran: list[str] = []
    with pytest.raises(HookTimeoutError):
        pool.call(lambda: release.wait(5), (), 0.05, "hung")
    with pytest.raises(HookTimeoutError):
        pool.call(lambda: ran.append("late"), (), 0.05, "queued")
    release.set()
    assert pool.call(lambda: "ok", (), 2.0, "after") == "ok"
    assert ran == []  # the queued call was cancelled before it could start


def test_past_the_fleets_kept_each_decision_still_carries_its_own_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The factories kept per fleet are bounded: past the bound they are made afresh."""
    from stepledger.resolution import resolver as resolvers

    monkeypatch.setattr(resolvers, "_FLEETS_KEPT", 2)
    setup = Setup(pay(Service()))
    fleets = [f"fleet-{i}" for i in range(5)]
    states = []
    for i, fleet in enumerate(fleets):
        state = WorkflowState(f"wf-{i}")
        intent = EventFactory(fleet, "agent", setup.clock).intent(
            f"wf-{i}", "s", setup.tool, ARGS, sequence=0
        )
        setup.log.append(intent)
        state.apply(intent)
        states.append(state)
    setup.past_deadline()
    for state in states:
        setup.resolver.resolve(state, "s")
    outcomes = [e for e in setup.log.events if e.type == "step_outcome"]
    assert [e.fleet_id for e in outcomes] == fleets
    assert len(setup.resolver._fleets) <= 2

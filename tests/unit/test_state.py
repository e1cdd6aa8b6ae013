"""The pure step state machine."""

from __future__ import annotations

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import CompensationStatus, OutcomeStatus, Source, Verdict
from stepledger.domain.state import (
    MAY_HAVE_HAPPENED,
    RunStatus,
    StepStatus,
    WorkflowState,
    replace,
    replay,
)
from stepledger.domain.steps import with_changes
from stepledger.domain.tools import Tool
from tests.unit.factories import comp_key, factory, pay_tool

F = factory()
PAY = pay_tool()
BOOK = Tool(name="book", effect="compensatable", compensate=lambda a, k, r: None)


def started(attempt: int = 1, read_only: bool = False) -> ev.Event:
    return F.workflow_started("wf", name="", attempt=attempt, read_only=read_only, max_attempts=2)


def run_status(state: WorkflowState) -> RunStatus:
    """The run status read afresh (mypy would keep an earlier assert's narrowing)."""
    return state.status


def intent(step: str = "s", attempt: int = 1, tool: Tool = PAY, seq: int = 0) -> ev.Event:
    return F.intent("wf", step, tool, {"a": 1}, sequence=seq, attempt=attempt)


def outcome(
    status: OutcomeStatus, step: str = "s", attempt: int = 1, source: Source = Source.AGENT
) -> ev.Event:
    return F.outcome("wf", step, attempt=attempt, status=status, source=source, result={"ok": 1})


def test_intent_without_outcome_is_in_doubt() -> None:
    state = replay("wf", [started(), intent()])
    assert [s.step_id for s in state.in_doubt()] == ["s"]
    assert state.steps["s"].status is StepStatus.INTENDED


def test_outcome_settles_and_duplicates_change_nothing() -> None:
    events = [started(), intent(), outcome(OutcomeStatus.SUCCEEDED)]
    state = replay("wf", events + events)
    step = state.steps["s"]
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.AGENT
    assert step.result_json == '{"ok":1}' and not state.anomalies


def test_outcome_without_intent_is_an_anomaly() -> None:
    state = replay("wf", [started(), outcome(OutcomeStatus.SUCCEEDED)])
    assert [a.kind for a in state.anomalies] == ["no_intent"]
    assert "s" not in state.steps


def test_late_agent_outcome_after_recovery_decision_is_recorded_not_applied() -> None:
    events = [
        started(),
        intent(),
        outcome(OutcomeStatus.NOT_HAPPENED, source=Source.RECOVERY_QUERY),
        outcome(OutcomeStatus.SUCCEEDED),
    ]
    state = replay("wf", events)
    assert state.steps["s"].status is StepStatus.NOT_HAPPENED
    assert [a.kind for a in state.anomalies] == ["late_outcome"]


def test_retry_after_failure_opens_a_new_attempt() -> None:
    events = [started(), intent(), outcome(OutcomeStatus.FAILED), intent(attempt=2)]
    state = replay("wf", events)
    assert state.steps["s"].attempt == 2 and state.steps["s"].in_doubt
    stale = outcome(OutcomeStatus.SUCCEEDED, attempt=1, source=Source.RECOVERY_REDRIVE)
    assert state.apply(stale) is not None and state.steps["s"].in_doubt


def test_second_intent_while_in_doubt_is_an_anomaly() -> None:
    state = replay("wf", [started(), intent(), intent(attempt=2)])
    assert state.steps["s"].attempt == 1
    assert state.anomalies[0].kind == "intent_while_intended"


def test_compensation_path() -> None:
    events = [
        started(),
        intent(tool=BOOK),
        outcome(OutcomeStatus.SUCCEEDED),
        F.envelope(
            "wf",
            "s",
            ev.CompensationIntended(
                idempotency_key=comp_key("wf", "s", BOOK),
                reason="saga",
                source=Source.AGENT,
                deadline=F.clock(),
            ),
        ),
    ]
    state = replay("wf", events)
    assert state.steps["s"].status is StepStatus.COMPENSATING
    done = F.envelope(
        "wf",
        "s",
        ev.CompensationOutcome(status=CompensationStatus.NOTHING_TO_UNDO, source=Source.AGENT),
    )
    state.apply(done)
    after = state.steps["s"]
    assert after.status is StepStatus.COMPENSATED


def test_abandonment_and_human_verdict_rejudge_the_step() -> None:
    events = [
        started(),
        intent(),
        F.envelope(
            "wf", "s", ev.StepAbandoned(reason="r", escalation_id="e1", source=Source.RECOVERY)
        ),
    ]
    state = replay("wf", events)
    assert state.steps["s"].status is StepStatus.ABANDONED and state.steps["s"].escalation_open
    wrong = F.envelope(
        "wf", "s", ev.EscalationResolved(escalation_id="nope", verdict=Verdict.HAPPENED, by="ann")
    )
    assert state.apply(wrong) is not None
    right = F.envelope(
        "wf", "s", ev.EscalationResolved(escalation_id="e1", verdict=Verdict.HAPPENED, by="ann")
    )
    assert state.apply(right) is None
    step = state.steps["s"]
    assert step.status is StepStatus.SUCCEEDED and step.resolved_by is Source.HUMAN
    assert not step.escalation_open


def test_approval_gate() -> None:
    request = F.envelope("wf", "s", ev.ApprovalRequested(tool="pay"))
    state = replay("wf", [started(), request])
    assert state.steps["s"].status is StepStatus.AWAITING_APPROVAL
    state.apply(F.envelope("wf", "s", ev.ApprovalDecided(granted=True, by="ann")))
    decided = state.steps["s"]
    assert decided.status is StepStatus.APPROVED
    state.apply(intent())
    assert state.steps["s"].in_doubt


def test_dead_letter_and_clearing() -> None:
    dead = F.envelope("wf", None, ev.WorkflowDeadLettered(attempt=3, reason="r", escalation_id="e"))
    state = replay("wf", [started(), dead])
    assert state.status is RunStatus.DEAD_LETTERED
    assert state.apply(F.envelope("wf", None, ev.WorkflowResumed(attempt=4))) is not None
    cleared = F.envelope(
        "wf", None, ev.EscalationResolved(escalation_id="e", verdict=Verdict.CLEARED, by="ann")
    )
    assert state.apply(cleared) is None
    assert run_status(state) is RunStatus.RUNNING


def test_read_only_restart_forgets_earlier_steps() -> None:
    state = replay("wf", [started(read_only=True), intent(), started(attempt=2, read_only=True)])
    assert state.steps == {} and state.attempt == 2


def test_steps_are_ordered_by_sequence() -> None:
    state = replay("wf", [started(), intent("b", seq=1), intent("a", seq=0)])
    assert [s.step_id for s in state.ordered_steps()] == ["a", "b"]


def test_a_step_copy_refuses_a_field_steps_do_not_have() -> None:
    state = replay("wf", [started(), intent()])
    step = state.steps["s"]
    assert replace(step, attempt=2).attempt == 2 and step.attempt == 1
    with pytest.raises(TypeError, match="nope"):
        replace(step, nope=1)
    with pytest.raises(TypeError, match="nope"):
        with_changes(step, {"attempt": 2, "nope": 1})


def test_the_saga_counts_follow_every_step_change() -> None:
    # pivot_happened is spelt out for speed: it must still agree with pivot and the status.
    book = intent("b", tool=BOOK, seq=1)
    state = replay("wf", [started(), intent(), book])
    for step in state.steps.values():
        assert step.pivot_happened == (step.status in MAY_HAVE_HAPPENED and step.pivot)
    assert state.pivots_happened == 1 and state.unresolved_undoable == 1
    state.apply(outcome(OutcomeStatus.NOT_HAPPENED))
    assert state.pivots_happened == 0

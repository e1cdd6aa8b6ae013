"""Pure recovery decisions: what to do with a step, given its tool and the time."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain import resolution as rs
from stepledger.domain.enums import CompensationStatus, OutcomeStatus, Source
from stepledger.domain.state import StepState, StepStatus, replay
from stepledger.domain.tools import Found, NotFound, Tool
from tests.unit.factories import T0, comp_key, factory

F = factory()


def query(args: dict[str, Any], key: str) -> Found | NotFound:
    return NotFound()


def run(args: dict[str, Any], key: str) -> Any:
    return {"ok": True}


PAY = Tool(name="pay", effect="idempotent", keyed=True, policy="query", query=query, timeout_s=2)
PAY_REDRIVE = Tool(
    name="pay", effect="idempotent", keyed=True, policy="query", query=query, redrive=run
)
BOOK = Tool(name="book", effect="compensatable", keyed=True, compensate=lambda a, k, r: None)
MAIL = Tool(name="mail", effect="irreversible")
MAIL_PROBED = Tool(name="mail", effect="irreversible", query=query)
READ = Tool(name="read", effect="read_only", run=run)
IDEM = Tool(name="idem", effect="idempotent", run=run, max_attempts=2)


def step_of(tool: Tool, *events: ev.Event) -> StepState:
    intent = F.intent("wf", "s", tool, {"a": 1}, sequence=0)
    return replay("wf", [intent, *events]).steps["s"]


def test_nothing_before_the_deadline_plus_grace() -> None:
    step = step_of(PAY)
    assert step.deadline is not None
    grace = timedelta(seconds=1)
    early = rs.decide(step, PAY, now=step.deadline + timedelta(milliseconds=999), grace=grace)
    assert early.kind is rs.ActionKind.WAIT and early.due_at == step.deadline + grace
    due = rs.decide(step, PAY, now=step.deadline + grace, grace=grace)
    assert due.kind is rs.ActionKind.QUERY and due.attempt == 1


@pytest.mark.parametrize(
    ("tool", "kind"),
    [
        (PAY, rs.ActionKind.QUERY),
        (IDEM, rs.ActionKind.REDRIVE),
        (BOOK, rs.ActionKind.COMPENSATE),
        (MAIL, rs.ActionKind.ESCALATE),
    ],
)
def test_each_policy_maps_to_its_action(tool: Tool, kind: rs.ActionKind) -> None:
    step = step_of(tool)
    assert step.deadline is not None
    assert rs.decide(step, tool, now=step.deadline).kind is kind


def test_read_only_and_settled_steps_need_nothing() -> None:
    read = step_of(READ)
    later = T0 + timedelta(days=1)
    assert rs.decide(read, READ, now=later).kind is rs.ActionKind.NONE
    done = step_of(PAY, F.outcome("wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED))
    assert rs.decide(done, PAY, now=later).kind is rs.ActionKind.NONE


def test_unknown_tool_gives_up_into_the_human_queue_without_dead_letter() -> None:
    step = step_of(PAY)
    action = rs.decide(step, None, now=T0 + timedelta(days=1))
    assert action.kind is rs.ActionKind.GIVE_UP
    assert action.escalation is rs.EscalationKind.NO_TOOL and not action.dead_letter


def test_exhausted_attempts_give_up_and_dead_letter() -> None:
    step = replace(step_of(IDEM), recovery_attempts=2)
    action = rs.decide(step, IDEM, now=T0 + timedelta(days=1))
    assert action.kind is rs.ActionKind.GIVE_UP and action.dead_letter
    assert (
        action.escalation is rs.EscalationKind.EXHAUSTED and "2 recovery attempts" in action.reason
    )


def test_failed_attempts_back_off_doubling_up_to_the_timeout() -> None:
    step = step_of(PAY)
    assert step.deadline is not None
    last_at = step.deadline + timedelta(seconds=10)
    failed = replace(step, recovery_attempts=2, last_at=last_at)
    due = rs.due_at(failed, PAY, grace=timedelta(0), retry_base_s=0.5)
    assert due == last_at + timedelta(seconds=1.0)
    many = replace(failed, recovery_attempts=9)
    assert rs.due_at(many, PAY, grace=timedelta(0), retry_base_s=0.5) == (
        last_at + timedelta(seconds=PAY.timeout_s)
    )


def test_a_started_compensation_is_carried_through() -> None:
    comp = F.envelope(
        "wf",
        "s",
        ev.CompensationIntended(
            idempotency_key=comp_key("wf", "s", BOOK),
            reason="r",
            source=Source.RECOVERY_COMPENSATE,
            deadline=T0,
        ),
    )
    step = step_of(BOOK, comp)
    assert step.status is StepStatus.COMPENSATING
    action = rs.decide(step, BOOK, now=T0 + timedelta(days=1))
    assert action.kind is rs.ActionKind.COMPENSATE


def test_missing_hook_gives_up() -> None:
    no_run = Tool(name="idem", effect="idempotent")
    step = step_of(no_run)
    action = rs.decide(step, no_run, now=T0 + timedelta(days=1))
    assert action.kind is rs.ActionKind.GIVE_UP and action.escalation is rs.EscalationKind.NO_HOOK


def test_escalate_probes_only_when_the_tool_can_be_queried() -> None:
    later = T0 + timedelta(days=1)
    assert not rs.decide(step_of(MAIL), MAIL, now=later).probe
    assert rs.decide(step_of(MAIL_PROBED), MAIL_PROBED, now=later).probe


def test_query_not_found_redrives_only_with_an_explicit_safe_redrive() -> None:
    assert not rs.redrive_after_not_found(PAY)
    assert rs.redrive_after_not_found(PAY_REDRIVE)
    unkeyed = Tool(name="x", effect="irreversible", policy="query", query=query, redrive=run)
    assert not rs.redrive_after_not_found(unkeyed)


def test_answers_map_to_statuses() -> None:
    assert rs.query_status(Found({"id": 1})) is OutcomeStatus.SUCCEEDED
    assert rs.query_status(NotFound()) is OutcomeStatus.NOT_HAPPENED
    assert rs.compensation_status(NotFound()) is CompensationStatus.NOTHING_TO_UNDO
    assert rs.compensation_status({"status": "cancelled"}) is CompensationStatus.SUCCEEDED
    assert rs.answer_evidence(Found(1)) == {"found": True, "result": 1}


def late(status: OutcomeStatus, attempt: int = 1) -> ev.StepOutcome:
    return ev.StepOutcome(status=status, source=Source.AGENT, attempt=attempt)


def decided(status: OutcomeStatus) -> StepState:
    return step_of(
        PAY, F.outcome("wf", "s", attempt=1, status=status, source=Source.RECOVERY_QUERY)
    )


def test_late_success_after_not_happened_is_a_conflict() -> None:
    verdict = rs.judge_late_outcome(
        decided(OutcomeStatus.NOT_HAPPENED), late(OutcomeStatus.SUCCEEDED)
    )
    assert verdict is rs.LateVerdict.CONFLICT


def test_late_failure_after_success_is_superseded() -> None:
    verdict = rs.judge_late_outcome(decided(OutcomeStatus.SUCCEEDED), late(OutcomeStatus.FAILED))
    assert verdict is rs.LateVerdict.SUPERSEDED
    same = rs.judge_late_outcome(decided(OutcomeStatus.SUCCEEDED), late(OutcomeStatus.SUCCEEDED))
    assert same is rs.LateVerdict.SUPERSEDED


def test_late_success_of_an_abandoned_attempt_is_a_conflict_and_on_escalated_is_evidence() -> None:
    retried = replace(decided(OutcomeStatus.NOT_HAPPENED), attempt=2, status=StepStatus.SUCCEEDED)
    assert (
        rs.judge_late_outcome(retried, late(OutcomeStatus.SUCCEEDED, 1)) is rs.LateVerdict.CONFLICT
    )
    assert (
        rs.judge_late_outcome(retried, late(OutcomeStatus.FAILED, 1)) is rs.LateVerdict.SUPERSEDED
    )
    abandoned = replace(decided(OutcomeStatus.NOT_HAPPENED), status=StepStatus.ABANDONED)
    verdict = rs.judge_late_outcome(abandoned, late(OutcomeStatus.SUCCEEDED))
    assert verdict is rs.LateVerdict.EVIDENCE

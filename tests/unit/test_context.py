"""The agent's working context, rebuilt from the log only."""

from __future__ import annotations

from stepledger.domain.context import StepSummary, build_context, fold_steps, keep_last, render
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.state import StepStatus, WorkflowState, replay
from stepledger.domain.tools import Tool
from tests.unit.factories import factory

F = factory()
LOGIN = Tool(
    name="login", effect="idempotent", keyed=True, policy="escalate", secret_args={"password"}
)
SEARCH = Tool(name="search", effect="read_only")


def state_with(steps: int) -> WorkflowState:
    events = [F.workflow_started("wf", name="", attempt=1, read_only=False, max_attempts=5)]
    events.append(
        F.intent("wf", "login", LOGIN, {"user": "ann", "password": "hunter2"}, sequence=0)
    )
    events.append(F.outcome("wf", "login", attempt=1, status=OutcomeStatus.SUCCEEDED, result="ok"))
    for i in range(1, steps):
        events.append(F.intent("wf", f"s{i}", SEARCH, {"q": i}, sequence=i))
        status = OutcomeStatus.FAILED if i == 2 else OutcomeStatus.SUCCEEDED
        events.append(
            F.outcome(
                "wf",
                f"s{i}",
                attempt=1,
                status=status,
                result=[i],
                error="boom" if i == 2 else None,
            )
        )
    return replay("wf", events)


def test_summaries_are_ordered_and_keep_secrets_redacted() -> None:
    context = build_context(state_with(4))
    assert [s.step_id for s in context] == ["login", "s1", "s2", "s3"]
    login = context[0]
    assert login.arguments is not None and login.arguments["user"] == "ann"
    assert login.arguments["password"] == "[redacted]"
    assert "hunter2" not in render(context)
    assert context[2].status is StepStatus.FAILED and context[2].error == "boom"
    assert context[3].result == [3]


def test_keep_last_folds_old_steps_into_one_summary() -> None:
    context = build_context(state_with(6), keep_last(2))
    assert [s.step_id for s in context] == ["login..s3", "s4", "s5"]
    folded = context[0]
    assert folded.covers == 4 and folded.arguments is None
    assert folded.result == {"statuses": {"succeeded": 3, "failed": 1}}
    assert "(4 steps)" in render(context)


def test_keep_last_can_drop_arguments_and_leaves_short_histories_alone() -> None:
    context = build_context(state_with(2), keep_last(5, keep_arguments=False))
    assert [s.step_id for s in context] == ["login", "s1"]
    assert all(s.arguments is None for s in context)


def test_a_custom_hook_may_drop_steps() -> None:
    def only_failures(summaries: list[StepSummary]) -> list[StepSummary]:
        return [s for s in summaries if s.status is StepStatus.FAILED]

    context = build_context(state_with(4), only_failures)
    assert [s.step_id for s in context] == ["s2"]
    assert fold_steps(context).covers == 1

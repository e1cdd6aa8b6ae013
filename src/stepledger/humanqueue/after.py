"""What a person's answer causes, and who acts next (pure; the inbox and the CLI say it).

An answer is an event; it re-judges a step or a workflow and runs nothing.  The recovery
daemon is done with a step once a verdict settled it (only a compensation's intent reopens a
step, :mod:`stepledger.recovery.reopen`), and nothing in stepledger restarts an agent: the
workflow goes on when its runner opens it again (``ledger.workflow(id)``: the agent
restarted, a scheduler, a person), except that a runner still waiting for an approval
(``ResumeOptions.approval_wait_s``) goes on by itself.  A person must know that, or they wait for a
workflow that stays ``running`` forever.
"""

from __future__ import annotations

from stepledger.humanqueue.cases import Answer, Case, CaseKind

_OPENS = (
    "the workflow ({status} now) goes on when its agent opens it again "
    "(ledger.workflow({wf!r}): the agent restarted, a scheduler, or by hand)"
)


def what_next(case: Case) -> str:
    """What the case's counted answer caused and who acts next; empty while undecided."""
    decision = case.decision
    if decision is None:
        return ""
    tool = case.subject.tool if case.subject is not None else "the tool"
    opens = _OPENS.format(status=case.workflow_status, wf=case.workflow_id)
    resume = f"Nothing runs by itself: the recovery daemon is done with the step, and {opens}"
    if case.kind is CaseKind.APPROVAL:
        return _approval(decision.answer, opens)
    if case.kind is CaseKind.WORKFLOW:
        return _workflow(case, decision.answer)
    texts = {
        Answer.HAPPENED: (
            f"The step is succeeded{' with the result given' if decision.result else ''}. "
            f"{resume}; that run goes on past it without calling {tool} again."
        ),
        Answer.NOT_HAPPENED: (
            f"The step is not_happened. {resume}; that run calls {tool} again, once, under the "
            "same idempotency key (an earlier call arriving late collides with it)."
        ),
        Answer.COMPENSATED: (
            f"The step is compensated: its effect is undone and it never runs again. {resume}; "
            "that run is told the step was compensated (StepCompensatedError) and goes on "
            "without it, typically by compensating the workflow."
        ),
    }
    return texts.get(decision.answer, "")


def _approval(answer: Answer, opens: str) -> str:
    waiting = "an agent still waiting for it (ResumeOptions.approval_wait_s) goes on at once"
    if answer is Answer.APPROVE:
        return (
            f"The step may run this exact call (another call asks again): {waiting}; "
            f"otherwise {opens}, and that run makes the call."
        )
    return (
        f"The step never runs: {waiting} and is refused (ApprovalDeniedError); otherwise "
        f"{opens}, and that run is refused the step."
    )


def _workflow(case: Case, answer: Answer) -> str:
    if answer is Answer.CLEARED and case.workflow_status == "running":
        return (
            f"The workflow may run again, with attempts up to {case.workflow_max_attempts}. "
            f"Nothing resumes it by itself: it stays running until its agent opens it again "
            f"(ledger.workflow({case.workflow_id!r}): the agent restarted, a scheduler, or by "
            "hand)."
        )
    if answer is Answer.CLEARED:
        return (
            "The effects left standing are accepted as they are: the workflow stays "
            f"{case.workflow_status} and nothing more runs."
        )
    return "The workflow is compensated: nothing is left standing and nothing more runs."

"""The step state machine: a pure fold of a workflow's events into step and workflow states.

Every reader of the log (resume, recovery, tests of the projector) judges a step by this
one fold.  The first decision for an intent wins; a later, conflicting one is kept as an
anomaly, never applied silently and never lost.  A step's values and statuses are in
:mod:`stepledger.domain.steps` (and importable from here), its transitions in
:mod:`stepledger.domain.transitions`; this module folds a workflow: its claims, its end, its
escalation, and each step event handed to its step's transition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.enums import Verdict, WorkflowStatus
from stepledger.domain.steps import (
    ENDED,
    MAY_HAVE_HAPPENED,
    RETRYABLE,
    SETTLED,
    UNRESOLVED,
    Anomaly,
    RunStatus,
    StepState,
    StepStatus,
    replace,
    with_changes,
)
from stepledger.domain.transitions import TRANSITIONS, Problem

__all__ = [
    "ENDED",
    "FENCED_OFF",
    "MAY_HAVE_HAPPENED",
    "RETRYABLE",
    "SETTLED",
    "UNRESOLVED",
    "Anomaly",
    "RunStatus",
    "StepState",
    "StepStatus",
    "WorkflowState",
    "replace",
    "replay",
]


@dataclass
class WorkflowState:
    """One workflow as the log tells it; ``apply`` folds events into it."""

    workflow_id: str
    fleet_id: str = ""
    name: str = ""
    status: RunStatus = RunStatus.RUNNING
    attempt: int = 0
    max_attempts: int = 5
    """The limit of resumption attempts; an operator's claim (a cancel or a restart carried
    through) moves it by one, so it counts no attempt of the workflow's."""
    read_only: bool = False
    runner: str | None = None
    """The runner whose claim owns the current attempt (the first claim of it in the log)."""
    escalation_id: str | None = None
    pause: int = 0
    """How many pauses the workflow has seen (the number of the latest)."""
    paused_by: str | None = None
    """Who paused the workflow, while it is paused (None: not paused)."""
    pause_reason: str = ""
    recovery_held_by: str | None = None
    """Who paused the workflow holding recovery too, while that pause holds (None: recovery
    settles its in-doubt steps as ever)."""
    recovery_hold: str = ""
    """The latest pause that held recovery, in words (kept once lifted: the decisions taken
    at the unpause name it)."""
    hold_lifted_at: datetime | None = None
    """When the latest hold of recovery was lifted (None: never, or it still holds)."""
    cancel_requested_by: str | None = None
    """Who asked to cancel the workflow (None: nobody); no new step starts once asked."""
    cancel_reason: str = ""
    versions: dict[int, tuple[str | None, str | None]] = field(default_factory=dict)
    """Per claimed attempt: the application's and stepledger's version of its runner."""
    restarted_from: str | None = None
    """The workflow this one restarts, and ``restart_step`` the step it runs anew from."""
    restart_step: str | None = None
    restarted_as: str | None = None
    """The workflow restarted in this one's place (status ``restarted``)."""
    started_at: datetime | None = None
    last_at: datetime | None = None
    steps: dict[str, StepState] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    anomalies: list[Anomaly] = field(default_factory=list)
    pivots_happened: int = field(init=False, repr=False, compare=False)
    """How many steps are pivots that may have happened (kept by the fold: O(1) saga checks).

    Counts, not sets of ids: every tracked step of the recovery daemon holds a state."""
    unresolved_undoable: int = field(init=False, repr=False, compare=False)
    """How many undoable steps have an effect unknown or being undone (kept by the fold)."""

    def __post_init__(self) -> None:
        self.pivots_happened = sum(1 for s in self.steps.values() if s.pivot_happened)
        self.unresolved_undoable = sum(1 for s in self.steps.values() if s.unresolved_undoable)

    def put(self, step: StepState) -> None:
        """Store a step's new state and keep the saga counts in step with it."""
        old = self.steps.get(step.step_id)
        if old is not None:
            self.pivots_happened -= old.pivot_happened
            self.unresolved_undoable -= old.unresolved_undoable
        self.steps[step.step_id] = step
        self.pivots_happened += step.pivot_happened
        self.unresolved_undoable += step.unresolved_undoable

    @property
    def paused(self) -> bool:
        """True while an operator's pause holds the workflow."""
        return self.paused_by is not None

    @property
    def halted(self) -> bool:
        """True when no new step may start: the workflow is paused or its cancel was asked."""
        return self.paused_by is not None or self.cancel_requested_by is not None

    @property
    def shown_status(self) -> RunStatus:
        """The status readers show: a running workflow held by an operator is ``paused``
        (or ``cancelling``); the fold keeps it running, which it is (it may be resumed)."""
        if self.status is not RunStatus.RUNNING:
            return self.status
        if self.cancel_requested_by is not None:
            return RunStatus.CANCELLING
        return RunStatus.PAUSED if self.paused_by is not None else RunStatus.RUNNING

    def version_of(self, attempt: int) -> str:
        """The versions of the runner that claimed ``attempt``, in words (for errors)."""
        app, own = self.versions.get(attempt, (None, None))
        return version_words(app, own)

    def copy(self) -> WorkflowState:
        """A copy to fold into apart: the containers are new, the steps (values) shared."""
        return dataclasses.replace(
            self,
            steps=dict(self.steps),
            seen=set(self.seen),
            anomalies=list(self.anomalies),
            versions=dict(self.versions),
        )

    def clear_steps(self) -> None:
        """Forget every step (a read-only workflow started over)."""
        self.steps.clear()
        self.pivots_happened = self.unresolved_undoable = 0

    def ordered_steps(self) -> list[StepState]:
        """Steps by their sequence in the workflow."""
        return sorted(self.steps.values(), key=_order)

    def in_doubt(self) -> list[StepState]:
        """Steps with an intent and no outcome."""
        return [s for s in self.ordered_steps() if s.in_doubt]

    def apply(self, event: ev.Event) -> Anomaly | None:
        """Fold one event in; a duplicate changes nothing; a contradiction returns an anomaly."""
        if event.event_id in self.seen:
            return None
        self.seen.add(event.event_id)
        self.fleet_id = self.fleet_id or event.fleet_id
        self.started_at = self.started_at or event.occurred_at
        self.last_at = event.occurred_at
        problem = _apply_body(self, event)
        if problem is None:
            return None
        anomaly = Anomaly(event.event_id, self.workflow_id, event.step_id, *problem)
        self.anomalies.append(anomaly)
        return anomaly


def _order(step: StepState) -> tuple[object, ...]:
    return (step.sequence, step.first_at or 0, step.step_id)


def version_words(app: str | None, own: str | None) -> str:
    """``app version X (stepledger Y)``, with ``unset``/``unknown`` for what is not known."""
    return f"app version {app or 'unset'} (stepledger {own or 'unknown'})"


def replay(workflow_id: str, events: list[ev.Event]) -> WorkflowState:
    """Fold a workflow's events, in log order, into its state."""
    state = WorkflowState(workflow_id)
    for event in events:
        state.apply(event)
    return state


_STEP_BODIES = frozenset({ev.StepIntended, ev.StepOutcome})
#: The anomalies of a runner's claim that a newer (or competing) claim of the workflow fenced off.
FENCED_OFF = frozenset({"zombie_intent", "zombie_compensation"})


def _apply_body(wf: WorkflowState, event: ev.Event) -> Problem | None:
    body = event.body
    if type(body) in _STEP_BODIES and event.step_id is not None:
        return _apply_step(wf, event, event.step_id)  # most events: skip the chain below
    if isinstance(body, ev.WorkflowStarted | ev.WorkflowResumed):
        return _on_workflow_run(wf, body)
    if isinstance(body, ev.WorkflowFinished):
        if body.runner is not None and wf.runner not in (None, body.runner):
            return "zombie_finish", f"runner {body.runner} ended a workflow {wf.runner} owns"
        wf.status = _RUN_STATUS[body.status]
        wf.restarted_as = body.restarted_as or wf.restarted_as
        if body.escalation_id is not None:
            wf.escalation_id = body.escalation_id
        return None
    if isinstance(body, ev.WorkflowDeadLettered):
        wf.status, wf.escalation_id = RunStatus.DEAD_LETTERED, body.escalation_id
        return None
    if isinstance(body, ev.EscalationResolved) and event.step_id is None:
        return _on_workflow_cleared(wf, body)
    if isinstance(body, ev.AnomalyObserved):
        return (body.kind, body.detail)
    if isinstance(body, ev.ModelTurnReused):
        return None  # a replay's mark for the cost ledger: the turn's step is unchanged
    steer = _STEERING.get(type(body))
    if steer is not None:
        return steer(wf, body)
    if isinstance(body, ev.BudgetReserved | ev.BudgetSettled | ev.BudgetRaised):
        # The budget topic's records: on a step log by mistake, they change no step.
        return ("budget_event_on_step_log", f"{body.type} belongs on the budget topic")
    if event.step_id is None:
        return ("missing_step_id", f"{body.type} needs a step id")
    return _apply_step(wf, event, event.step_id)


def _on_workflow_run(
    wf: WorkflowState, body: ev.WorkflowStarted | ev.WorkflowResumed
) -> Problem | None:
    lost = _claim_lost(wf, body)
    if lost is not None:
        return lost
    if body.attempt > wf.attempt or wf.runner is None:
        wf.runner = body.runner
    if isinstance(body, ev.WorkflowStarted):
        wf.name, wf.read_only, wf.max_attempts = body.name, body.read_only, body.max_attempts
        if body.restarted_from is not None:
            wf.restarted_from, wf.restart_step = body.restarted_from, body.restart_step
        if body.attempt > 1 and wf.read_only:
            # A read-only workflow restarts from scratch: earlier steps no longer count.
            wf.clear_steps()
    operator = isinstance(body, ev.WorkflowResumed) and body.operator is not None
    if operator and body.attempt > wf.attempt:
        # An operator's claim counts no attempt: the limit moves with it (once per attempt).
        wf.max_attempts += 1
    wf.attempt = max(wf.attempt, body.attempt)
    if body.app_version is not None or body.stepledger_version is not None:
        wf.versions[body.attempt] = (body.app_version, body.stepledger_version)
    if wf.status is RunStatus.DEAD_LETTERED:
        return ("run_while_dead_lettered", f"attempt {body.attempt} after the dead letter")
    return None


def _claim_lost(wf: WorkflowState, body: ev.WorkflowStarted | ev.WorkflowResumed) -> Problem | None:
    """A claim that came after another claim of the same or a newer attempt owns nothing.

    Only claims that name their runner (0.3.0 on) are judged: older ones were never fenced.
    """
    if body.runner is None or body.attempt > wf.attempt:
        return None
    if body.attempt == wf.attempt and wf.runner in (None, body.runner):
        return None
    kind = "stale_claim" if body.attempt < wf.attempt else "competing_claim"
    return kind, (
        f"runner {body.runner} claimed attempt {body.attempt} after runner {wf.runner} "
        f"claimed attempt {wf.attempt}; the first claim in the log owns the workflow"
    )


def _zombie(wf: WorkflowState, body: ev.StepIntended | ev.CompensationIntended) -> Problem | None:
    """A runner's claim on an effect (an intent, a compensation) written under a claim of the
    workflow that a newer (or competing) claim before it fenced off: it decides nothing."""
    if body.epoch == 0 or body.epoch > wf.attempt:
        # Not fenced (the daemon's compensations, events written before the field existed),
        # or this view holds no claims.
        return None
    if body.epoch == wf.attempt and (body.runner is None or wf.runner in (None, body.runner)):
        return None
    what = "intent" if type(body) is ev.StepIntended else "compensation"
    return f"zombie_{what}", (
        f"{what} attempt {body.attempt} by runner {body.runner} (epoch {body.epoch}) after "
        f"runner {wf.runner} claimed attempt {wf.attempt}; it decides nothing"
    )


def _on_workflow_cleared(wf: WorkflowState, body: ev.EscalationResolved) -> Problem | None:
    if wf.escalation_id is None or body.escalation_id != wf.escalation_id:
        return ("unknown_escalation", f"workflow has no open escalation {body.escalation_id}")
    if wf.status is RunStatus.COMPENSATION_INCOMPLETE:
        return _on_standing_resolved(wf, body)
    if wf.status is not RunStatus.DEAD_LETTERED:
        return ("unknown_escalation", f"workflow has no open escalation {body.escalation_id}")
    wf.status, wf.escalation_id = RunStatus.RUNNING, None
    # Clearing grants a fresh budget of attempts, counted from the one that was dead-lettered.
    wf.max_attempts = wf.attempt + wf.max_attempts
    return None


def _on_standing_resolved(wf: WorkflowState, body: ev.EscalationResolved) -> Problem | None:
    """A human answered the effects a compensation left standing.

    ``compensated``: they took the forward actions, nothing is left standing, the workflow
    is compensated.  ``cleared``: the effects stand and that is accepted (the escalation is
    closed, the workflow stays ``compensation_incomplete``).
    """
    if body.verdict is Verdict.COMPENSATED:
        wf.status = RunStatus.COMPENSATED
    elif body.verdict is not Verdict.CLEARED:
        return ("bad_verdict", f"{body.verdict.value} does not answer effects left standing")
    wf.escalation_id = None
    return None


def _on_paused(wf: WorkflowState, body: ev.WorkflowPaused) -> Problem | None:
    """A pause holds a running workflow; a second one while it holds changes nothing."""
    if wf.status in ENDED:
        return ("pause_after_end", f"paused by {body.by} after it ended {wf.status.value}")
    if wf.paused_by is None:
        wf.paused_by, wf.pause_reason = body.by, body.reason
    wf.pause = max(wf.pause, body.pause)
    if body.hold_recovery and wf.recovery_held_by is None:
        # A held pause over a plain one holds recovery from here on, until the unpause.
        wf.recovery_held_by, wf.hold_lifted_at = body.by, None
        why = f": {body.reason}" if body.reason else ""
        wf.recovery_hold = f"pause {body.pause} by {body.by}{why}"
    return None


def _on_unpaused(wf: WorkflowState, body: ev.WorkflowUnpaused) -> Problem | None:
    """An unpause lifts the pause it names; one of an older pause lifts nothing."""
    if wf.paused_by is None or body.pause != wf.pause:
        return (
            "stale_unpause",
            f"unpause of pause {body.pause} by {body.by}; pause {wf.pause} "
            f"{'holds' if wf.paused_by else 'was lifted'}",
        )
    wf.paused_by, wf.pause_reason = None, ""
    if wf.recovery_held_by is not None:
        wf.recovery_held_by, wf.hold_lifted_at = None, wf.last_at  # the unpause's time
        wf.recovery_hold += f" (unpaused by {body.by})"
    return None


def _on_cancel_requested(wf: WorkflowState, body: ev.WorkflowCancelRequested) -> Problem | None:
    """The first request to cancel stands; no new step starts from it on."""
    if wf.status in ENDED:
        return ("cancel_after_end", f"cancel by {body.by} after it ended {wf.status.value}")
    if wf.cancel_requested_by is None:
        wf.cancel_requested_by, wf.cancel_reason = body.by, body.reason
    return None


#: The operators' events (pause, unpause, cancel): they hold a workflow, never end it.
_STEERING: dict[type[object], Callable[[WorkflowState, Any], Problem | None]] = {
    ev.WorkflowPaused: _on_paused,
    ev.WorkflowUnpaused: _on_unpaused,
    ev.WorkflowCancelRequested: _on_cancel_requested,
}

_BLANK = StepState("", StepStatus.INTENDED)


def _apply_step(wf: WorkflowState, event: ev.Event, step_id: str) -> Problem | None:
    step = wf.steps.get(step_id)
    body = event.body
    at = event.occurred_at
    if type(body) is ev.StepIntended or type(body) is ev.CompensationIntended:
        zombie = _zombie(wf, body)  # a runner's claim on an effect, fenced by the claims before it
        if zombie is not None:
            return zombie
    if step is None:
        if not isinstance(body, ev.StepIntended | ev.ApprovalRequested):
            return ("no_intent", f"{body.type} for a step with no intent")
        step = with_changes(_BLANK, {"step_id": step_id, "first_at": at})
    transition = TRANSITIONS.get(type(body))
    if transition is None:
        return ("unexpected_event", f"{body.type} does not apply to a step")
    changes, problem = transition(step, body, at)
    if changes is not None:
        changes["last_at"] = at
        wf.put(with_changes(step, changes))
    return problem


_RUN_STATUS = {status: RunStatus(status.value) for status in WorkflowStatus}

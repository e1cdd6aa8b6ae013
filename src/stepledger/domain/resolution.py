"""Pure recovery decisions: what to do next with a step, and how to read a hook's answer.

Given a step as the log tells it, its tool and the time, :func:`decide` says whether to
wait, query, re-drive, compensate, escalate or give up.  Nothing here does I/O; the
resolver (``stepledger.resolution.resolver``) carries the decisions out and records them.

One clock for due times: a recorded time (an intent's deadline, when the last event was
written) is on its writer's wall clock, which may run ahead of or behind the decider's.
When the decider knows when the events reached it (:class:`Arrival`, on its own clock and
never before they were appended), every wait is measured from there and the writer's
clock only lends the lengths (the timeout); the recorded times decide only without one.
Since the agent's budget started before its intent was appended, a step is then never
due before the agent's own monotonic budget ran out, and never later than the wait after
the arrival, however far the writer's clock is off.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from stepledger.domain import events as ev
from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
)
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.times import later, seconds
from stepledger.domain.tools import Found, NotFound, Tool


class ActionKind(StrEnum):
    """The next thing recovery does with a step."""

    NONE = "none"
    """Nothing: the step is settled, read-only, waiting for a human, or not ours to judge."""
    WAIT = "wait"
    """Not due yet: the deadline plus grace (or the retry back-off) has not passed."""
    QUERY = "query"
    """Ask the tool whether the effect happened, by idempotency key."""
    REDRIVE = "redrive"
    """Call the tool again with the same idempotency key."""
    COMPENSATE = "compensate"
    """Run the tool's forward correction (it tolerates that nothing happened)."""
    ESCALATE = "escalate"
    """The policy says a human decides: abandon the step into the human queue."""
    GIVE_UP = "give_up"
    """Recovery cannot resolve it (attempts exhausted, no tool or hook): abandon and escalate."""


class EscalationKind(StrEnum):
    """Why a step went to the human queue (part of its escalation id)."""

    POLICY = "policy"
    EXHAUSTED = "exhausted"
    NO_TOOL = "no_tool"
    NO_HOOK = "no_hook"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Action:
    """A decision about one step: what to do, as which recovery attempt, and why."""

    kind: ActionKind
    """What to do."""
    attempt: int = 0
    """The recovery attempt this is (1-based); 0 when nothing runs."""
    reason: str = ""
    """Why, in words a human reads in the escalation queue."""
    due_at: datetime | None = None
    """When the step becomes (or became) due for recovery."""
    escalation: EscalationKind | None = None
    """For ESCALATE and GIVE_UP: the kind of escalation opened."""
    dead_letter: bool = False
    """For GIVE_UP after exhausted attempts: a record also goes to the dead-letter topic."""
    probe: bool = False
    """For ESCALATE: query the tool first so the human sees what it says."""


#: Statuses recovery acts on: an intent with no outcome, or a compensation with no outcome.
ACTIONABLE = frozenset({StepStatus.INTENDED, StepStatus.COMPENSATING})


@dataclass(frozen=True)
class Arrival:
    """When a step's events reached the decider, on the decider's own clock.

    Each time is no earlier than the event's append to the log (the moment it was read, or
    the broker's append time taken to this clock by an upper bound of the clock's lead), so
    a wait measured from it never ends before the writer's own budget did.
    """

    intent: datetime | None = None
    """When the step's latest intent reached the decider (None: not known)."""
    last: datetime | None = None
    """When the step's latest event reached the decider (None: not known)."""

    def after(self, moment: datetime) -> Arrival:
        """The arrival once one more event (not an intent) of the step came at ``moment``."""
        return Arrival(self.intent, moment)


def arrived(arrival: Arrival | None, event: ev.Event, at: datetime | None) -> Arrival | None:
    """A step's arrival once one more of its events reached the decider ``at`` (None: when
    is not known).

    An event whose arrival is not known leaves none known: the step's waits then go by the
    recorded times rather than by two clocks mixed (a known one after it starts afresh, a
    later bound of the intent's arrival too).
    """
    if at is None:
        return None
    if isinstance(event.body, ev.StepIntended) or arrival is None:
        return Arrival(at, at)
    return arrival.after(at)


def step_arrivals(
    events: Iterable[ev.Event], at: Mapping[str, datetime], refused: Container[str] = ()
) -> dict[str, Arrival]:
    """Each step's arrival from its events in log order and when each reached the decider
    (by event id); a step whose latest event's arrival is not known has none.

    Only an event the fold took begins a wait, as for the recovery daemon: one it refused
    (``refused``: its anomalies' event ids; a zombie's intent, a late outcome) and a
    duplicate leave the step's waits where they were.
    """
    found: dict[str, Arrival | None] = {}
    seen: set[str] = set()
    for event in events:
        step_id, event_id = event.step_id, event.event_id
        if step_id is None or event_id in seen or event_id in refused:
            continue
        seen.add(event_id)
        found[step_id] = arrived(found.get(step_id), event, at.get(event_id))
    return {step_id: arrival for step_id, arrival in found.items() if arrival is not None}


def retry_delay(attempts: int, tool: Tool | None, base_s: float) -> timedelta:
    """The back-off after ``attempts`` failed recovery attempts: doubling, capped by the timeout."""
    if attempts <= 0:
        return timedelta(0)
    cap = tool.timeout_s if tool is not None else 60.0
    # 2 ** attempts is exact in Python and any size: clamp before turning it into seconds.
    return seconds(min(cap, base_s * 2.0 ** min(attempts - 1, 64)))


def due_at(
    step: StepState,
    tool: Tool | None,
    *,
    grace: timedelta,
    retry_base_s: float = 0.25,
    arrival: Arrival | None = None,
) -> datetime | None:
    """When recovery may act on the step: deadline + grace, and the back-off after a failure.

    With an ``arrival`` the waits start when the events reached the decider (see the module
    docstring), whatever the writers' clocks recorded; without one, at the recorded times.
    """
    if step.status not in ACTIONABLE:
        return None
    arrival = arrival or Arrival()
    last = arrival.last or step.last_at
    if step.status is StepStatus.COMPENSATING:
        # A compensation records no deadline in the state: give it the tool's timeout.
        timeout = seconds(tool.timeout_s if tool is not None else 0.0)
        base = (last or step.intended_at or step.first_at) or step.deadline
        start = None if base is None else later(later(base, timeout), grace)
    else:
        deadline = deadline_on(step, arrival)
        start = None if deadline is None else later(deadline, grace)
    if start is None:
        return None
    if step.recovery_attempts > 0 and last is not None:
        backoff = later(last, retry_delay(step.recovery_attempts, tool, retry_base_s))
        start = max(start, backoff)
    return start


def deadline_on(step: StepState, arrival: Arrival | None) -> datetime | None:
    """The intent's deadline on the decider's clock: its timeout after it arrived, if known."""
    arrived = None if arrival is None else arrival.intent
    if arrived is None or step.deadline is None or step.intended_at is None:
        return step.deadline
    return later(arrived, step.deadline - step.intended_at)


def decide(
    step: StepState,
    tool: Tool | None,
    *,
    now: datetime,
    grace: timedelta = timedelta(0),
    retry_base_s: float = 0.25,
    arrival: Arrival | None = None,
) -> Action:
    """Decide the next recovery action for a step (``tool`` is None when none is registered)."""
    if step.status not in ACTIONABLE or step.effect is EffectClass.READ_ONLY:
        # Read-only work is restarted by its agent, never resolved.
        return Action(ActionKind.NONE)
    due = due_at(step, tool, grace=grace, retry_base_s=retry_base_s, arrival=arrival)
    if due is None or now < due:
        return Action(ActionKind.WAIT, due_at=due)
    attempt = step.recovery_attempts + 1
    if tool is None:
        return _give_up(step, attempt, due, EscalationKind.NO_TOOL, f"no tool {step.tool!r} here")
    if step.recovery_attempts >= tool.max_attempts:
        reason = f"{step.recovery_attempts} recovery attempts failed (max {tool.max_attempts})"
        return _give_up(step, attempt, due, EscalationKind.EXHAUSTED, reason, dead_letter=True)
    return _by_policy(step, tool, attempt, due)


def query_before_due(
    step: StepState,
    tool: Tool | None,
    *,
    now: datetime,
    grace: timedelta = timedelta(0),
    retry_base_s: float = 0.25,
    arrival: Arrival | None = None,
) -> Action | None:
    """A query that may settle an in-doubt step before it is due, or None when none may.

    Before the deadline the call may still be in flight (a slow run, not a dead one), so
    only an answer that *finds* the effect decides: it happened, and nothing the late call
    does can make it not have happened.  "Not found" proves nothing yet and waits for the
    deadline, as do re-drives and compensations.  Only a step whose due-time decision is
    itself a query (its policy, or a compensatable step looked up instead) qualifies.
    """
    if step.status is not StepStatus.INTENDED or tool is None or tool.query is None:
        return None
    due = due_at(step, tool, grace=grace, retry_base_s=retry_base_s, arrival=arrival)
    if due is None or now >= due:
        return None  # due (or no deadline known): the ordinary decision applies
    at_due = decide(step, tool, now=due, grace=grace, retry_base_s=retry_base_s, arrival=arrival)
    if at_due.kind is not ActionKind.QUERY:
        return None
    reason = "queried before the deadline: only a found effect settles the step"
    return Action(ActionKind.QUERY, at_due.attempt, reason, due)


def _by_policy(step: StepState, tool: Tool, attempt: int, due: datetime) -> Action:
    if step.status is StepStatus.COMPENSATING:
        # A compensation that began (by an agent or an earlier attempt) is carried through.
        return _needs(tool.compensate is not None, ActionKind.COMPENSATE, step, attempt, due)
    policy = step.policy or tool.resolution
    if policy is ResolutionPolicy.COMPENSATE and step.after_pivot:
        return _forward_after_pivot(step, tool, attempt, due)
    if policy is ResolutionPolicy.QUERY:
        return _needs(tool.query is not None, ActionKind.QUERY, step, attempt, due)
    if policy is ResolutionPolicy.REDRIVE:
        return _needs(redrive_allowed(tool), ActionKind.REDRIVE, step, attempt, due)
    if policy is ResolutionPolicy.COMPENSATE:
        return _needs(tool.compensate is not None, ActionKind.COMPENSATE, step, attempt, due)
    return Action(
        ActionKind.ESCALATE,
        attempt,
        f"tool {tool.name!r} is {(step.effect or tool.effect_class).value}: policy escalate",
        due,
        EscalationKind.POLICY,
        probe=tool.query is not None,
    )


def _forward_after_pivot(step: StepState, tool: Tool, attempt: int, due: datetime) -> Action:
    """A step after a pivot that may have happened is never compensated: forward or a human.

    Undoing it would not unwind the saga (the pivot stands), so it is re-driven with its key
    when a repeat is safe, looked up when it can only be queried, and escalated otherwise.
    The intent says whether it came after a pivot (``after_pivot``): the SDK knew the
    workflow when it wrote it, recovery sees only this step's events.
    """
    if redrive_allowed(tool):
        return Action(ActionKind.REDRIVE, attempt, due_at=due)
    if tool.query is not None:
        return Action(ActionKind.QUERY, attempt, due_at=due)
    return Action(
        ActionKind.ESCALATE,
        attempt,
        f"step {step.step_id!r} ({tool.name}) came after the pivot: it is not compensated, "
        "and it cannot be re-driven safely",
        due,
        EscalationKind.POLICY,
    )


def _needs(ok: bool, kind: ActionKind, step: StepState, attempt: int, due: datetime) -> Action:
    if ok:
        return Action(kind, attempt, due_at=due)
    reason = f"tool {step.tool!r} has no hook to {kind.value}"
    return _give_up(step, attempt, due, EscalationKind.NO_HOOK, reason)


def _give_up(
    step: StepState,
    attempt: int,
    due: datetime,
    kind: EscalationKind,
    reason: str,
    *,
    dead_letter: bool = False,
) -> Action:
    return Action(ActionKind.GIVE_UP, attempt, reason, due, kind, dead_letter=dead_letter)


def redrive_allowed(tool: Tool) -> bool:
    """True when calling again cannot repeat the effect: the tool is keyed or idempotent."""
    return tool.repeatable and tool.redrive_hook is not None


def redrive_after_not_found(tool: Tool) -> bool:
    """True when a query that found nothing is followed by a re-drive instead of not_happened.

    A tool opts in by declaring an explicit ``redrive`` hook (``run`` alone is not enough),
    and only if a re-drive is safe.
    """
    return tool.redrive is not None and redrive_allowed(tool)


def query_status(answer: Found | NotFound) -> OutcomeStatus:
    """The outcome a query answer proves: found means succeeded, not found not_happened."""
    return OutcomeStatus.SUCCEEDED if isinstance(answer, Found) else OutcomeStatus.NOT_HAPPENED


def compensation_status(answer: Any) -> CompensationStatus:
    """A compensate hook's answer: ``NotFound`` means there was nothing to undo."""
    if isinstance(answer, NotFound):
        return CompensationStatus.NOTHING_TO_UNDO
    return CompensationStatus.SUCCEEDED


def answer_evidence(answer: Any) -> dict[str, Any]:
    """A hook's answer as JSON-ready evidence."""
    if isinstance(answer, Found):
        return {"found": True, "result": answer.result}
    if isinstance(answer, NotFound):
        return {"found": False, "detail": answer.detail}
    return {"result": answer}


class LateVerdict(StrEnum):
    """How an outcome that arrived after a decision is judged."""

    SUPERSEDED = "superseded"
    """It agrees with, or is weaker evidence than, the decision that stands."""
    CONFLICT = "conflict"
    """It says the effect happened where the ledger says it did not, or was undone."""
    EVIDENCE = "evidence"
    """A human is deciding the step: it is recorded for them."""


def judge_late_outcome(step: StepState, outcome: ev.StepOutcome) -> LateVerdict:
    """Judge an outcome the fold refused because the step was already decided.

    The first decision always stands in the fold; a conflict opens an escalation so a
    human re-judges the step with both answers in front of them.
    """
    if step.status is StepStatus.ABANDONED or step.escalation_open:
        return LateVerdict.EVIDENCE
    happened = outcome.status is OutcomeStatus.SUCCEEDED
    if outcome.attempt < step.attempt:
        # An attempt given up as failed or not happened did happen: the retry may repeat it.
        return LateVerdict.CONFLICT if happened else LateVerdict.SUPERSEDED
    if outcome.attempt > step.attempt:
        return LateVerdict.SUPERSEDED
    denied = {
        StepStatus.NOT_HAPPENED,
        StepStatus.FAILED,
        StepStatus.COMPENSATING,
        StepStatus.COMPENSATED,
    }
    return LateVerdict.CONFLICT if happened and step.status in denied else LateVerdict.SUPERSEDED

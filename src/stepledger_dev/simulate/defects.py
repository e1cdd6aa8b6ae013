"""Test-only switches: put a fixed defect's old behaviour back, to prove the simulator finds it.

Each switch patches the library's function back to its form before the fix, for the
duration of one run (:func:`switched`), in this process only.  The tests in
``tests/unit/test_simulate_defects.py`` run a budget of seeds with a switch on (the
simulator must find a violation) and off (it must find none).

- ``frozen_runner`` (issue 20): no check of the intent's deadline before the call, so a
  runner paused between its intent and its call calls after recovery decided the step.
- ``two_live_runners`` (issue 20): no read-back of the intent before a call that is not safe
  to repeat and no check of the claim at open, so two live runners both call.
- ``agent_clock_deadline`` (one clock for deadlines): every wait of a step runs from the
  times its events record on their writers' clocks (``resolution.due_at`` without an
  arrival), so a daemon decides early on an agent whose clock runs behind.
- ``agent_clock_ahead`` (issue 42, one clock for due times): the recovery daemon's due time
  is the later of the recorded deadline and the one re-anchored on its clock, and the
  resolver and a resuming agent judge by recorded times, so an agent clock running ahead
  delays every decision by as much.
- ``unfenced_compensation`` (issue 42, fenced compensations): ``wf.compensate()`` as it was
  before compensations were fenced: no ownership check, the claim names no runner.
- ``worded_step`` (issue 42, a step is the logical call): a framework call matched to a step
  by the digest of its arguments, as before steps were matched by occurrence.
- ``fixed_secret_mark`` (issue 42, one fingerprint): the arguments digest an approval binds
  puts one fixed marker in place of every secret value.
- ``unchecked_log_identity`` (issue 42, state bound to its log): the checkpoint view as it
  was before: every record of the checkpoint topic read, whichever step log it names (or
  none), and a checkpoint or progress the step log contradicts handed out.
- ``forgotten_claims`` (found by this simulator): the recovery tracker takes the claim it
  keeps for a workflow as the latest, known or not, so a daemon restarted from a checkpoint
  taken after a workflow's latest claim tracks a fenced-off runner's intent as live.
- ``stepping_daemon_clock`` (found by this simulator): the recovery daemon's arrivals, lead
  samples and due times on its wall clock, so a forward step of that clock decides early.
- ``refused_event_waits`` (found by this simulator): every event of a tracked step begins a
  wait, those the fold refused too, so a runner's late outcome after the daemon's
  compensation claim holds the compensation back a timeout more.
- ``unclaimed_dead_letter`` (found by this simulator): a resume past the limit dead-letters
  the workflow without claiming it first, so a runner still alive goes on making effects
  (a refund) after the workflow ended.
- ``assumed_first_start`` (found by this simulator): a run start read after a take-over is
  taken as the workflow's first claim for a compensation too, so a daemon whose checkpoint
  fell between two racing starts tracks the losing starter's intent as live, and its own
  compensation claim, which the log refuses, is carried through from its tracker's fold (the
  booking of a trip the winner completed is cancelled).
- ``resume_by_writer_clock`` (found by this simulator): a resuming agent measures a step's
  waits from the times its events record on their writers' clocks (or from when it first
  held them, when later), not from the broker's append times, so an agent whose clock runs
  ahead of the writer's settles the writer's step early.

A switch of a function that has since moved or changed shape keeps the old form here
(``_old_compensate``, ``_old_step_id``, ``_old_redacted``, the clock rules ``_old_due_at``
and ``_old_daemon_due``), written against today's signatures, so it keeps restoring the old
behaviour as the library moves on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest import mock

from stepledger.domain import fingerprint, secrets
from stepledger.domain.resolution import due_at as _FIXED_DUE_AT
from stepledger.domain.tools import Tool
from stepledger.integrations._core import AgentSteps, _auto_id
from stepledger.producer import compensation, fence
from stepledger.recovery.daemon import RecoveryDaemon

_FIXED_ATTEMPT = RecoveryDaemon._attempt

#: Every switch: what it puts back.
SWITCHES: dict[str, str] = {
    "frozen_runner": "no deadline check before a call (issue 20)",
    "two_live_runners": "no intent read-back and no claim check (issue 20)",
    "agent_clock_deadline": "recovery goes by the agent's recorded deadline only",
    "agent_clock_ahead": "a step falls due by the agent's recorded deadline (issue 42)",
    "unfenced_compensation": "compensations without an ownership check (issue 42)",
    "worded_step": "framework calls matched to steps by their arguments' digest (issue 42)",
    "fixed_secret_mark": "one fixed marker for every secret in an approval's digest (issue 42)",
    "unchecked_log_identity": "checkpoint records not checked against the step log (issue 42)",
    "forgotten_claims": "recovery decides steps of workflows whose claims it does not know",
    "stepping_daemon_clock": "the recovery daemon's due times on its wall clock",
    "refused_event_waits": "an event the fold refused restarts its step's wait",
    "unclaimed_dead_letter": "a resume past the limit dead-letters without a claim",
    "assumed_first_start": "a compensation judged by claims assumed after a take-over",
    "resume_by_writer_clock": "a resuming agent settles a step by its writer's recorded times",
}


@contextlib.contextmanager
def switched(names: tuple[str, ...]) -> Iterator[None]:
    """Run with these old behaviours put back (none: as the library is)."""
    unknown = [n for n in names if n not in SWITCHES]
    if unknown:
        raise ValueError(f"unknown defect switch(es): {', '.join(unknown)}")
    with contextlib.ExitStack() as stack:
        for name in names:
            for target, attribute, value in _PATCHES[name]():
                stack.enter_context(mock.patch.object(target, attribute, value))
        yield


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _frozen_runner() -> list[tuple[Any, str, Any]]:
    return [(fence, "ensure_in_time", _nothing)]


def _two_live_runners() -> list[tuple[Any, str, Any]]:
    return [
        (fence, "needs_read_back", lambda tool: False),
        (fence, "ensure_claimed", _nothing),
    ]


def _agent_clock_deadline() -> list[tuple[Any, str, Any]]:
    from stepledger.domain import resolution

    return [(resolution, "due_at", _old_due_at)]


def _old_due_at(
    step: Any, tool: Any, *, grace: Any, retry_base_s: float = 0.25, arrival: Any = None
) -> Any:
    """``resolution.due_at`` before one clock: every wait runs from the recorded times (the
    writer's clock), whoever decides and whenever the events reached it."""
    return _FIXED_DUE_AT(step, tool, grace=grace, retry_base_s=retry_base_s)


def _agent_clock_ahead() -> list[tuple[Any, str, Any]]:
    from stepledger.producer.settling import Arrivals

    return [
        (RecoveryDaemon, "_due", _old_daemon_due),
        (RecoveryDaemon, "_attempt", _old_attempt),
        (Arrivals, "of", _old_arrivals_of),
    ]


def _old_daemon_due(self: RecoveryDaemon, step: Any, arrival: Any) -> Any:
    """``RecoveryDaemon._due`` with the re-anchoring it had before one clock: the later of
    the recorded deadline plus grace and the deadline re-anchored on the daemon's clock (so
    an agent clock running ahead holds the step back by as much)."""
    from stepledger.domain import resolution as rs
    from stepledger.domain.state import StepStatus
    from stepledger.domain.times import later

    recorded = _FIXED_DUE_AT(
        step,
        self.tools.get(step.tool),
        grace=self.resolver.grace,
        retry_base_s=self.options.retry_base_s,
    )
    if recorded is None or arrival is None or step.status is not StepStatus.INTENDED:
        return recorded
    anchored = rs.deadline_on(step, arrival)
    return recorded if anchored is None else max(recorded, later(anchored, self.resolver.grace))


def _old_attempt(
    self: RecoveryDaemon, workflow_id: str, events: Any, step_id: str, arrival: Any
) -> Any:
    """``RecoveryDaemon._attempt`` before one clock: the resolver judged by recorded times."""
    return _FIXED_ATTEMPT(self, workflow_id, events, step_id, None)


def _old_arrivals_of(self: Any, step: Any) -> Any:
    """``settling.Arrivals.of`` before one clock: a resuming agent knew no arrival."""
    from stepledger.domain.resolution import Arrival

    return Arrival()


def _unfenced_compensation() -> list[tuple[Any, str, Any]]:
    return [(compensation, "compensate", _old_compensate)]


def _old_compensate(workflow: Any, reason: str) -> list[str]:
    """``compensation.compensate`` before compensations were fenced (no ownership check)."""
    from stepledger.domain.saga import compensation_plan
    from stepledger.errors import StepInDoubtError

    undo, blockers = compensation_plan(workflow.state)
    if blockers:
        names = ", ".join(f"{s.step_id} ({s.status.value})" for s in blockers)
        raise StepInDoubtError(
            f"cannot compensate around steps whose outcome is unknown: {names}",
            workflow_id=workflow.workflow_id,
        )
    return [
        step.step_id
        for step in undo
        if _OLD_COMPENSATE_ONE(workflow, step, workflow.tool(step.tool), reason)
    ]


def _OLD_COMPENSATE_ONE(workflow: Any, step: Any, tool: Tool, reason: str) -> bool:
    """``compensation._compensate_one`` before compensations were fenced."""
    from datetime import timedelta

    from stepledger.domain import events as ev
    from stepledger.domain import ids
    from stepledger.domain.enums import CompensationStatus, Source
    from stepledger.domain.state import StepStatus
    from stepledger.resolution.hooks import intent_arguments, known_result

    events, wf = workflow.ledger.events, workflow.workflow_id
    if step.status is StepStatus.SUCCEEDED:
        intended = ev.CompensationIntended(
            idempotency_key=ids.compensation_key(step.idempotency_key),
            reason=reason,
            source=Source.AGENT,
            deadline=events.clock() + timedelta(seconds=tool.timeout_s),
            attempt=step.attempt,
        )
        workflow.record(events.envelope(wf, step.step_id, intended, step.attempt, "agent"))
    assert tool.compensate is not None
    try:
        answer = tool.compensate(intent_arguments(step), step.idempotency_key, known_result(step))
    except Exception as exc:
        failed = ev.CompensationOutcome(
            status=CompensationStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            source=Source.AGENT,
        )
        workflow.record(events.envelope(wf, step.step_id, failed, step.attempt, "agent"))
        return False
    workflow.record(
        events.envelope(wf, step.step_id, compensation._outcome(answer), step.attempt, "agent")
    )
    return True


def _worded_step() -> list[tuple[Any, str, Any]]:
    return [(AgentSteps, "step_id", _old_step_id)]


def _old_step_id(self: AgentSteps, tool: Tool, arguments: Mapping[str, Any]) -> str:
    """``AgentSteps.step_id`` before steps were matched by occurrence: by argument digest."""
    digest = tool.legacy_digest(arguments)
    recorded = [s for s in self.workflow.state.ordered_steps() if s.tool == tool.name]
    unused = [s for s in recorded if s.step_id not in self.used]
    for step in unused:
        if step.arguments_digest in (digest, self._fingerprint(step.step_id, tool, arguments)):
            return self._use(step.step_id)
    for step in unused:
        if step.attempt == 0:
            return self._use(step.step_id)
    taken = {s.step_id for s in recorded} | self.used
    n = len(recorded) + 1
    while _auto_id(tool.name, n) in taken or _auto_id(tool.name, n) in self.workflow.state.steps:
        n += 1
    return self._use(_auto_id(tool.name, n))


def _fixed_secret_mark() -> list[tuple[Any, str, Any]]:
    return [(fingerprint, "redacted", _old_redacted)]


def _old_redacted(
    arguments: Mapping[str, Any],
    secret_args: frozenset[str],
    workflow_id: str,
    step_id: str,
    key: secrets.RedactionKey | None,
) -> dict[str, Any]:
    """``fingerprint.redacted`` before secrets were keyed: a fixed marker for each."""
    if not secret_args:
        return dict(arguments)
    return secrets.redact(arguments, secret_args, secrets.fixed_mark)


def _unchecked_log_identity() -> list[tuple[Any, str, Any]]:
    from stepledger.checkpoints.view import CheckpointView

    return [
        (CheckpointView, "_admit", lambda self, partition, headers: True),
        (CheckpointView, "_vouched", lambda self, partition, covering: covering),
        (CheckpointView, "_consistent", lambda self, partition, found, end: True),
    ]


def _forgotten_claims() -> list[tuple[Any, str, Any]]:
    from stepledger.recovery.tracker import Tracker

    return [
        (Tracker, "knows_claims", lambda self, workflow_id, partition: True),
        (Tracker, "_unfenced", lambda self, state, event, partition: False),
    ]


def _stepping_daemon_clock() -> list[tuple[Any, str, Any]]:
    from stepledger.recovery import daemon

    return [(daemon, "SteadyClock", lambda wall, timer=None: wall)]


def _refused_event_waits() -> list[tuple[Any, str, Any]]:
    from stepledger.recovery.tracker import Tracker

    return [(Tracker, "_moves_waits", staticmethod(lambda before, after: True))]


def _unclaimed_dead_letter() -> list[tuple[Any, str, Any]]:
    from stepledger.producer import opening

    return [(opening, "end_past_limit", opening.dead_letter)]


def _assumed_first_start() -> list[tuple[Any, str, Any]]:
    from stepledger.recovery.tracker import Tracker

    return [(Tracker, "_unfenced", _old_unfenced)]


def _old_unfenced(self: Any, state: Any, event: Any, partition: int) -> bool:
    """``Tracker._unfenced`` before compensation claims needed vouched claims: only a
    tracked step folded with no claim, of a workflow whose claims are not known."""
    from stepledger.recovery.reopen import FENCED

    fenced = isinstance(event.body, FENCED) and state.attempt == 0
    return fenced and not self.knows_claims(event.workflow_id, partition)


def _resume_by_writer_clock() -> list[tuple[Any, str, Any]]:
    from stepledger.producer import settling

    return [(settling, "_as_read", lambda read, step: False)]


_PATCHES: dict[str, Callable[[], list[tuple[Any, str, Any]]]] = {
    "frozen_runner": _frozen_runner,
    "two_live_runners": _two_live_runners,
    "agent_clock_deadline": _agent_clock_deadline,
    "agent_clock_ahead": _agent_clock_ahead,
    "unfenced_compensation": _unfenced_compensation,
    "worded_step": _worded_step,
    "fixed_secret_mark": _fixed_secret_mark,
    "unchecked_log_identity": _unchecked_log_identity,
    "forgotten_claims": _forgotten_claims,
    "stepping_daemon_clock": _stepping_daemon_clock,
    "refused_event_waits": _refused_event_waits,
    "unclaimed_dead_letter": _unclaimed_dead_letter,
    "assumed_first_start": _assumed_first_start,
    "resume_by_writer_clock": _resume_by_writer_clock,
}

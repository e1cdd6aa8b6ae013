"""``decided_within_bound``: every step in doubt is decided in time, by the broker's clock.

A step is in doubt from the record that opens it (an intent, or a compensation with no
outcome) to the record after which the fold no longer holds it open (an outcome, an undo's
outcome, an escalation).  Its bound, on the broker's clock: the opening record's time plus
the tool's timeout (the deadline as the agent measured it), plus the grace recovery waits,
plus ``SLACK_MS`` for the daemon's own turns, plus every interval in which no recovery
daemon ran (killed, frozen) that overlaps the wait.  Read-only steps are left out: their
agent runs them again, nobody decides them.  Checked once, when the run has settled.

One allowance (docs/guarantees.md, "One clock for deadlines"): a restarted daemon takes its
partitions over from its checkpoint, which keeps no arrival times, and reads what follows
with no sample of its lead over the broker yet, so a step open at the take-over counts as
arrived then.  Its bound is then at least the take-over plus the opening record's timeout,
the grace and ``SLACK_MS`` (plus any later interval without a daemon): one timeout more at
most, never more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger_dev.simulate.invariants import Violation
from stepledger_dev.simulate.plan import GRACE_S
from stepledger_dev.simulate.simlog import Broker

#: The daemon's own share of the bound: polls, checkpoints, its turn coming round.
SLACK_MS = 2_000
_OPEN = (StepStatus.INTENDED, StepStatus.COMPENSATING)


def check(
    broker: Broker, down: list[list[int]], end_ms: int, takeovers: Sequence[int] = ()
) -> list[Violation]:
    """Every step of every workflow, in doubt no longer than its bound (``takeovers``: when
    a restarted recovery daemon started)."""
    found: list[Violation] = []
    workflows = sorted(
        {r.event.workflow_id for p in broker.partitions for r in p.records if r.event}
    )
    gaps = _Gaps(down, tuple(takeovers))
    for workflow in workflows:
        found.extend(_workflow(broker, workflow, gaps, end_ms))
    return found


@dataclass(frozen=True)
class _Gaps:
    """When no recovery daemon ran, and when a restarted one took its partitions over."""

    down: list[list[int]]
    takeovers: tuple[int, ...]

    def bound(self, start: int, due: int, until: int) -> int:
        """The latest a step opened at ``start`` (due at ``due``) may be decided."""
        bound = _bound(start, due, self.down, until)
        taken = [t for t in self.takeovers if start < t <= until]
        if taken:
            # Counted as arrived at the latest take-over: its timeout again from there.
            last = taken[-1]
            bound = max(bound, _bound(last, last + (due - start), self.down, until))
        return bound


def _workflow(broker: Broker, workflow: str, gaps: _Gaps, end_ms: int) -> list[Violation]:
    state = WorkflowState(workflow)
    opened: dict[str, tuple[int, int, str]] = {}
    """step -> (opened at, due at, what opened it), all broker milliseconds."""
    found: list[Violation] = []
    for record in broker.workflow_records(workflow, whole=True):
        event = record.event
        if event is None:
            continue
        state.apply(event)
        step_id = event.step_id
        step = None if step_id is None else state.steps.get(step_id)
        if step_id is None or step is None or step.effect is EffectClass.READ_ONLY:
            continue
        if step.status in _OPEN and step_id not in opened:
            timeout = timeout_ms(event)
            if timeout is not None:
                due = record.broker_ms + timeout
                opened[step_id] = (record.broker_ms, due, event.type)
        elif step.status not in _OPEN and step_id in opened:
            start, due, what = opened.pop(step_id)
            late = record.broker_ms - gaps.bound(start, due, record.broker_ms)
            if late > 0:
                found.append(_late(workflow, step_id, what, start, record.broker_ms, late))
    for step_id, (start, due, what) in opened.items():
        late = end_ms - gaps.bound(start, due, end_ms)
        if late > 0:
            detail = f"{step_id} ({what} at {start}ms) still undecided at {end_ms}ms"
            found.append(Violation("decided_within_bound", workflow, detail, end_ms))
    return found


def _bound(start: int, due: int, down: list[list[int]], until: int) -> int:
    stretch = sum(max(0, min(b if b >= 0 else until, until) - max(a, start)) for a, b in down)
    return due + int(GRACE_S * 1000) + SLACK_MS + stretch


def _late(workflow: str, step: str, what: str, start: int, decided: int, late: int) -> Violation:
    detail = f"{step} ({what} at {start}ms) decided at {decided}ms, {late}ms past its bound"
    return Violation("decided_within_bound", workflow, detail, decided)


def timeout_ms(event: ev.Event) -> int | None:
    """The timeout an intent or a compensation's claim records (deadline - occurred_at)."""
    body = event.body
    if isinstance(body, ev.StepIntended | ev.CompensationIntended):
        return (body.deadline - event.occurred_at) // timedelta(milliseconds=1)
    return None

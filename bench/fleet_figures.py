"""The fleet bench's arithmetic, without I/O: rates over processes, freshness, decisions.

Kept apart from ``bench.fleet`` (which starts clusters and processes) so each piece is unit
tested on made-up figures: ``tests/unit/test_bench_fleet.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from stepledger.domain import events as ev

#: The events that settle an in-doubt step by recovery's policy: an outcome (a query hook's
#: answer), a compensation's outcome, or the step handed to a human (escalation).
DECIDING = (ev.StepOutcome, ev.CompensationOutcome, ev.StepAbandoned)


def span_rate(reports: Iterable[Mapping[str, Any]]) -> float:
    """Aggregate steps/s of processes run together: all their steps over the span from the
    first one's start to the last one's end (wall clock, ``began``/``ended`` in seconds)."""
    done = list(reports)
    if not done:
        return 0.0
    span = max(r["ended"] for r in done) - min(r["began"] for r in done)
    steps = sum(r["steps"] for r in done)
    return steps / span if span > 0 else 0.0


def ratio_trend(ratios: Mapping[int, float]) -> tuple[float, float]:
    """(ratio at the most processes, ratio at the fewest): a Row's value and baseline, so
    "the ratio does not fall as processes are added" is the Row's own ``>=`` target."""
    counts = sorted(ratios)
    return ratios[counts[-1]], ratios[counts[0]]


def lags(acked: Mapping[Any, float], seen: Mapping[Any, float]) -> tuple[list[float], int]:
    """Seconds from each acknowledgement to the moment its row was first seen, and how many
    acknowledged rows were never seen (each key a step, times on one wall clock)."""
    found = [seen[key] - at for key, at in acked.items() if key in seen]
    return found, len(acked) - len(found)


@dataclass
class Doubt:
    """One in-doubt step: its recorded deadline and when recovery settled it."""

    deadline: datetime
    decided_at: datetime | None = None
    decision: str = ""


def doubts(
    events: Iterable[ev.Event], prefix: str, found: dict[tuple[str, str], Doubt] | None = None
) -> dict[tuple[str, str], Doubt]:
    """Fold events into the in-doubt steps of workflows named ``prefix...`` (into ``found``,
    read so far, if given): each step's intent deadline and its first deciding event."""
    found = {} if found is None else found
    for event in events:
        if not event.workflow_id.startswith(prefix) or event.step_id is None:
            continue
        key = (event.workflow_id, event.step_id)
        body = event.body
        if isinstance(body, ev.StepIntended):
            found.setdefault(key, Doubt(body.deadline))
        elif isinstance(body, DECIDING) and key in found and found[key].decided_at is None:
            found[key].decided_at, found[key].decision = event.occurred_at, body.type
    return found


@dataclass(frozen=True)
class Decisions:
    """Seconds each decided step came after its deadline + grace, and the exceptions."""

    late_s: list[float]
    early: int
    """Steps decided before their deadline (target: none)."""
    undecided: int
    by_kind: dict[str, int]


def decisions(found: Mapping[tuple[str, str], Doubt], grace_s: float) -> Decisions:
    """Lateness after deadline + grace of every decided step; early and undecided counts."""
    grace = timedelta(seconds=grace_s)
    late: list[float] = []
    early = undecided = 0
    kinds: dict[str, int] = {}
    for doubt in found.values():
        if doubt.decided_at is None:
            undecided += 1
            continue
        late.append((doubt.decided_at - (doubt.deadline + grace)).total_seconds())
        early += doubt.decided_at < doubt.deadline
        kinds[doubt.decision] = kinds.get(doubt.decision, 0) + 1
    return Decisions(late, early, undecided, kinds)


def paced_due(start: float, rate: float, agents: int, agent: int, n: int) -> float:
    """When an agent's n-th step is due so that ``agents`` agents together make ``rate``
    steps/s, their steps interleaved evenly (agent k's n-th is the (n*agents+k)-th)."""
    return start + (n * agents + agent) / rate

"""Reconcile: ask a queryable tool about every step the ledger has for it, report disagreements.

Two kinds of disagreement: ``missing_effect`` (the ledger says succeeded, the service has
no record under the key) and ``unrecorded_effect`` (the service has the effect, the ledger
says failed, not happened, abandoned or still in doubt).  Every attempt of a step is
checked under its own key, so an earlier attempt given up as not happened but done after
all is found too.  Disagreements can be recorded as ``AnomalyObserved`` events with
deterministic ids (running reconcile twice records each once).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain import ids
from stepledger.domain import resolution as rs
from stepledger.domain.enums import Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import ToolRegistryError
from stepledger.kafka.reader import read_topic
from stepledger.log import EventLog
from stepledger.resolution.hooks import call_bounded, checked_query

#: Ledger statuses that say the effect did not happen (or is not known to have).
_NOT_RECORDED = frozenset(
    {
        StepStatus.FAILED,
        StepStatus.NOT_HAPPENED,
        StepStatus.INTENDED,
        StepStatus.ABANDONED,
    }
)


@dataclass(frozen=True)
class AttemptRecord:
    """One intent attempt of a step as the ledger ends it."""

    workflow_id: str
    step_id: str
    fleet_id: str
    attempt: int
    idempotency_key: str
    arguments_json: str
    intended_at: datetime
    status: StepStatus


@dataclass(frozen=True)
class Disagreement:
    """The ledger and the service tell different stories about one attempt."""

    kind: str
    record: AttemptRecord
    answer: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view."""
        r = self.record
        return {
            "kind": self.kind,
            "workflow_id": r.workflow_id,
            "step_id": r.step_id,
            "attempt": r.attempt,
            "idempotency_key": r.idempotency_key,
            "ledger_status": r.status.value,
            "service": self.answer,
        }


@dataclass
class ReconcileReport:
    """What a sweep checked and found."""

    checked: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    recorded: int = 0


class AttemptCollector:
    """Folds the log and keeps, for one tool, how each intent attempt ended."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.workflows: dict[str, WorkflowState] = {}
        self._ended: list[AttemptRecord] = []

    def apply(self, event: ev.Event) -> None:
        """Fold one event; an intent closes the step's previous attempt."""
        state = self.workflows.setdefault(event.workflow_id, WorkflowState(event.workflow_id))
        before = state.steps.get(event.step_id or "")
        closes = isinstance(event.body, ev.StepIntended) and event.event_id not in state.seen
        if closes and before is not None and before.attempt and before.tool == self.tool:
            self._ended.append(_record(state, before.step_id))
        state.apply(event)

    def attempts(self) -> list[AttemptRecord]:
        """Every attempt of the tool: ended ones and each step's current one."""
        current = [
            _record(wf, step.step_id)
            for wf in self.workflows.values()
            for step in wf.steps.values()
            if step.tool == self.tool and step.attempt > 0
        ]
        return self._ended + current


def judge(record: AttemptRecord, answer: Found | NotFound) -> str | None:
    """The kind of disagreement between the ledger and the service, or None if they agree."""
    found = isinstance(answer, Found)
    if record.status is StepStatus.SUCCEEDED and not found:
        return "missing_effect"
    if record.status in _NOT_RECORDED and found:
        return "unrecorded_effect"
    return None


def reconcile_attempts(
    tool: Tool, attempts: Iterable[AttemptRecord], *, since: datetime | None = None
) -> ReconcileReport:
    """Query the tool for each attempt (bounded by its timeout) and report disagreements."""
    if tool.query is None:
        raise ToolRegistryError(f"tool {tool.name!r} has no query hook to reconcile with")
    query = checked_query(tool.query)
    report = ReconcileReport()
    for record in attempts:
        if since is not None and record.intended_at < since:
            continue
        arguments = json.loads(record.arguments_json or "{}")
        try:
            args = (arguments, record.idempotency_key)
            answer = call_bounded(query, args, tool.timeout_s, f"{tool.name}.query")
        except Exception as exc:
            report.errors.append(
                {
                    "workflow_id": record.workflow_id,
                    "step_id": record.step_id,
                    "attempt": record.attempt,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
            continue
        report.checked += 1
        kind = judge(record, answer)
        if kind is not None:
            report.disagreements.append(Disagreement(kind, record, rs.answer_evidence(answer)))
    return report


def record_disagreements(
    log: EventLog, factory: EventFactory, disagreements: Iterable[Disagreement]
) -> int:
    """Append each disagreement as an AnomalyObserved event (deterministic ids)."""
    count = 0
    for item in disagreements:
        r = item.record
        body = ev.AnomalyObserved(
            kind=f"reconcile_{item.kind}",
            detail=ids.canonical_json(item.to_json()),
            source=Source.RECONCILE,
        )
        maker = (
            factory
            if r.fleet_id in ("", factory.fleet_id)
            else EventFactory(r.fleet_id, factory.producer_id, factory.clock)
        )
        log.append(maker.envelope(r.workflow_id, r.step_id, body, item.kind, r.attempt))
        count += 1
    return count


def reconcile(
    settings: Settings,
    codec: Codec,
    tool: Tool,
    *,
    since: timedelta | None = None,
    now: datetime,
    max_time: float = 300.0,
) -> ReconcileReport:
    """Read the whole log, then reconcile every attempt of the tool since ``now - since``."""
    collector = AttemptCollector(tool.name)
    for record in read_topic(settings, codec, idle_timeout=0.1, max_time=max_time):
        if record.event is not None:
            collector.apply(record.event)
    cutoff = None if since is None else now - since
    return reconcile_attempts(tool, collector.attempts(), since=cutoff)


def _record(state: WorkflowState, step_id: str) -> AttemptRecord:
    step = state.steps[step_id]
    return AttemptRecord(
        workflow_id=state.workflow_id,
        step_id=step_id,
        fleet_id=state.fleet_id,
        attempt=step.attempt,
        idempotency_key=step.idempotency_key,
        arguments_json=step.arguments_json,
        intended_at=step.intended_at or step.first_at or datetime.min.replace(tzinfo=UTC),
        status=step.status,
    )

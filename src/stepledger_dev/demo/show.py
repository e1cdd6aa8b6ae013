"""How the demo shows things: recovery's decisions as lines, the rest as rich tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.humanqueue.escalations import OpenEscalation
from stepledger.readers.query import QueryResult, plain
from stepledger.terminal import safe, shell_arg
from stepledger_dev.demo.effects import KINDS, EffectCounts
from stepledger_dev.demo.script import Trip

STEP_COLUMNS = (
    "workflow_id",
    "step_id",
    "tool",
    "status",
    "resolved_by",
    "recovery_attempts",
    "escalation_open",
)
_WIDTH = 70


def decision(event: ev.Event) -> str | None:
    """A recovery- or human-relevant event in words; None for the agents' routine events."""
    body = event.body
    text: str | None = None
    if isinstance(body, ev.ResolutionAttempted):
        answer = _short(body.answer_json or body.error or "")
        text = f"recovery tried {body.policy.value} (attempt {body.attempt}): {answer}"
    elif isinstance(body, ev.StepOutcome) and body.source is not Source.AGENT:
        text = f"outcome {body.status.value}, decided by {body.source.value}"
    elif isinstance(body, ev.CompensationIntended):
        text = f"compensation intended by {body.source.value}: {body.reason}"
    elif isinstance(body, ev.CompensationOutcome):
        text = f"compensation {body.status.value} ({body.source.value})"
    elif isinstance(body, ev.StepAbandoned):
        text = f"abandoned by {body.source.value}: {body.reason}; escalation {body.escalation_id}"
    elif isinstance(body, ev.AnomalyObserved):
        text = f"anomaly {body.kind}: {_short(body.detail)}"
    elif isinstance(body, ev.EscalationResolved):
        text = f"escalation {body.escalation_id} answered {body.verdict.value} by {body.by}"
    elif isinstance(body, ev.WorkflowResumed):
        text = f"workflow resumed (attempt {body.attempt})"
    elif isinstance(body, ev.WorkflowFinished):
        text = f"workflow finished: {body.status.value}"
    elif isinstance(body, ev.WorkflowDeadLettered):
        text = f"workflow dead-lettered: {body.reason}"
    if text is None:
        return None
    where = event.workflow_id + (f"/{event.step_id}" if event.step_id else "")
    return f"{where:15} {text}"


def by_recovery(event: ev.Event) -> bool:
    """True for a decision recovery, a human or a reconciliation made (not an agent)."""
    source = getattr(event.body, "source", None)
    return source is not None and source is not Source.AGENT


def crash_table(trips: tuple[Trip, ...], states: Mapping[str, WorkflowState]) -> Table:
    """Where each trip stood when its agent process died, as the log tells it."""
    table = Table(title="What the crash left in the log", title_justify="left")
    for column in ("workflow", "steps (as the log tells it)", "crash point"):
        table.add_column(column)
    for trip in trips:
        state = states.get(trip.workflow_id)
        steps = [] if state is None else state.ordered_steps()
        chain = "  ".join(
            f"{s.step_id}:{'IN DOUBT' if s.status is StepStatus.INTENDED else s.status.value}"
            for s in steps
        )
        where = f"{trip.step}:{trip.point}" if trip.step else "-"
        table.add_row(trip.workflow_id, chain or "-", where)
    return table


def steps_table(result: QueryResult) -> Table:
    """The projected ``steps`` table, as the projector's snapshot holds it."""
    table = Table(title="steps (DuckDB, from the projector's snapshot)", title_justify="left")
    for column in result.columns:
        table.add_column(column)
    for row in result.rows:
        table.add_row(*(_cell(value) for value in row))
    return table


def effects_table(counts: EffectCounts) -> Table:
    """Real effects per workflow, as the services counted them."""
    table = Table(title="Effects counted by the services themselves", title_justify="left")
    table.add_column("workflow")
    for kind in KINDS:
        table.add_column(kind, justify="right")
    for wf, per in sorted(counts.per_workflow.items()):
        table.add_row(wf, *(str(per.get(kind, 0)) for kind in KINDS))
    table.add_row("all", *(str(counts.total(kind)) for kind in KINDS), style="bold")
    return table


def escalation_lines(item: OpenEscalation, answer_flag: str, connect: str) -> list[str]:
    """One open escalation and the exact command that answers it."""
    where = f"{item.workflow_id}/{item.step_id or '-'}"
    return [
        safe(f"escalation {item.escalation_id}: {where} ({item.tool}), status {item.status}"),
        safe(f"  reason: {item.reason}"),
        f"  answer: stepledger escalations resolve {shell_arg(item.escalation_id)} {answer_flag} "
        f"--by YOUR_NAME{connect}",
    ]


def answer_notes(*, local_broker: bool, keep: bool) -> list[str]:
    """Where the printed answer commands work: a local broker stops with the demo."""
    if keep:
        where = "the demo's own broker" if local_broker else "your broker"
        return [f"the commands below answer on {where} while the stack runs (until Ctrl-C)"]
    if local_broker:
        return [
            "the commands below need the demo's broker, which stops when the demo ends: to",
            "answer them, run `stepledger demo --keep DIR` (the stack keeps running and the",
            "inbox serves the cases) or `stepledger demo --bootstrap HOST:PORT` on a broker",
            "you keep",
        ]
    return [
        "the commands below answer on your broker, after the demo too; `stepledger demo "
        "--keep DIR` also serves them in the inbox",
    ]


def _cell(value: Any) -> str:
    shown = plain(value)
    return "" if shown is None else str(shown)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."

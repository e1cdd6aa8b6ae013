"""CLI commands of the runtime: approval gates and dead-lettered workflows.

``approve``/``deny`` answer a pivot step's approval request (``approvals show`` prints the
exact call it lets run); ``workflows clear`` lets a
workflow that passed its resumption limit run again (the same answer as
``escalations resolve ESC --cleared``, addressed by workflow id); ``workflows show``
prints a workflow as a resume would see it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stepledger.cli._approvals import approval_lines, approval_summary
from stepledger.cli._common import with_settings
from stepledger.cli._identity import BY_HELP, answerer
from stepledger.cli._operators import (
    cancel_command,
    pause_command,
    restart_command,
    unpause_command,
)
from stepledger.cli._turns import step_line
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.context import build_context
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory
from stepledger.domain.spend import spend_of
from stepledger.domain.state import RunStatus, WorkflowState, replay
from stepledger.errors import LedgerStateError
from stepledger.history.kafka import KafkaHistory
from stepledger.history.protocol import WorkflowHistory
from stepledger.humanqueue.answers import CLI_NOTE, Answerer, ensure_counted
from stepledger.humanqueue.cases import approval_case
from stepledger.log import KafkaEventLog
from stepledger.readers.lake import configured_lake
from stepledger.terminal import safe


def _db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        "db_path",
        envvar="STEPLEDGER_DB",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The projector's DuckDB file: read its snapshot plus the tail instead of a scan.",
    )(fn)


def reader_for(settings: Settings, db_path: Path | None) -> WorkflowHistory:
    """The lake (``Settings.lake``) or the snapshot and its tail when a projection is named,
    else the step log's history."""
    lake = configured_lake(settings.lake, settings.topic)
    if lake is not None:
        return KafkaHistory(settings, role="reader", snapshot=lake)
    if db_path is None:
        return KafkaHistory(settings, role="reader")
    return KafkaHistory(settings, role="reader", snapshot=db_path)


def _decide(settings: Settings, db_path: Path | None, granted: bool, **answer: Any) -> None:
    # The inbox's path: checked against the log first, read back after (one code path).
    by, auth = answerer(answer["by"])
    log = KafkaEventLog(settings)
    reader = reader_for(settings, db_path)
    try:
        answers = Answerer(log, EventFactory(settings.fleet_id, settings.producer_id), reader)
        receipt = answers.answer_approval(
            answer["workflow_id"],
            answer["step_id"],
            granted=granted,
            by=by,
            note=answer["note"] or CLI_NOTE,
            digest=answer["digest"],
            auth=auth,
        )
    finally:
        log.close()
        reader.close()
    ensure_counted(receipt)
    verdict = "approved" if granted else "denied"
    event = receipt.event
    body = event.body
    digest = body.arguments_digest if isinstance(body, ev.ApprovalDecided) else None
    call = f", call {digest[:16]}" if digest else ", a request that names no call"
    click.echo(
        safe(f"{verdict} {answer['workflow_id']}/{answer['step_id']} ({event.event_id}{call})")
    )


@click.command("approve")
@with_settings
@_db_option
@click.argument("workflow_id")
@click.argument("step_id")
@click.option("--by", default=None, help=BY_HELP)
@click.option("--note", default=None, help="Why.")
@click.option(
    "--digest",
    default=None,
    help="The digest `approvals show` printed (a prefix will do): refused if the call changed.",
)
def approve_command(settings: Settings, db_path: Path | None, **answer: Any) -> None:
    """Grant the approval a pivot step of WORKFLOW_ID waits for; the step may then run."""
    _decide(settings, db_path, True, **answer)


@click.command("deny")
@with_settings
@_db_option
@click.argument("workflow_id")
@click.argument("step_id")
@click.option("--by", default=None, help=BY_HELP)
@click.option("--note", default=None, help="Why.")
@click.option(
    "--digest",
    default=None,
    help="The digest `approvals show` printed (a prefix will do): refused if the call changed.",
)
def deny_command(settings: Settings, db_path: Path | None, **answer: Any) -> None:
    """Deny the approval a pivot step of WORKFLOW_ID waits for; the step will not run."""
    _decide(settings, db_path, False, **answer)


@click.group("approvals")
def approvals_group() -> None:
    """Inspect approval requests: the exact call an approval lets run."""


@approvals_group.command("show")
@with_settings
@_db_option
@click.argument("workflow_id")
@click.argument("step_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def approvals_show_command(
    settings: Settings, db_path: Path | None, workflow_id: str, step_id: str, as_json: bool
) -> None:
    """Show what approving a step lets run: its arguments (redacted), digest and the saga."""
    reader = reader_for(settings, db_path)
    try:
        case = approval_case(workflow_id, step_id, reader.read(workflow_id).events)
    finally:
        reader.close()
    if case is None:
        raise LedgerStateError(
            f"workflow {workflow_id!r} step {step_id!r} never asked for approval",
            workflow_id=workflow_id,
            step_id=step_id,
        )
    summary = approval_summary(case)
    if as_json:
        click.echo(json.dumps(summary, default=str))
        return
    for line in approval_lines(summary):
        click.echo(safe(line))


@click.group("workflows")
def workflows_group() -> None:
    """Inspect workflows, clear dead-lettered ones, pause, unpause, cancel or restart them."""


@workflows_group.command("clear")
@with_settings
@_db_option
@click.argument("workflow_id")
@click.option("--by", default=None, help=BY_HELP)
@click.option("--note", default="", help="Why it may run again.")
def clear_command(
    settings: Settings, db_path: Path | None, workflow_id: str, by: str | None, note: str
) -> None:
    """Let a dead-lettered workflow be resumed again, with a fresh budget of attempts."""
    state = _state(settings, db_path, workflow_id)
    if state.status is not RunStatus.DEAD_LETTERED or state.escalation_id is None:
        raise LedgerStateError(
            f"workflow {workflow_id!r} is {state.status.value}, not dead-lettered",
            workflow_id=workflow_id,
        )
    # The same event `escalations resolve ESC --cleared` appends: the same answer twice is one.
    name, auth = answerer(by)
    body = ev.EscalationResolved(
        escalation_id=state.escalation_id,
        verdict=Verdict.CLEARED,
        note=note,
        by=name,
        auth=auth.value,
    )
    factory = EventFactory(state.fleet_id or settings.fleet_id, settings.producer_id)
    log = KafkaEventLog(settings)
    try:
        log.append(factory.envelope(workflow_id, None, body))
    finally:
        log.close()
    click.echo(safe(f"cleared {workflow_id} (escalation {state.escalation_id})"))


@workflows_group.command("show")
@with_settings
@_db_option
@click.argument("workflow_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option(
    "--full",
    is_flag=True,
    help="Print each step whole (a model turn's recorded response, long arguments).",
)
def show_command(
    settings: Settings, db_path: Path | None, workflow_id: str, as_json: bool, full: bool
) -> None:
    """Show a workflow as a resume sees it: status, attempt and its steps in order.

    A model turn is summarised (model, tool calls, a preview of its text) and any other
    step cut to a line; --full prints what the log recorded.
    """
    events = _events(settings, db_path, workflow_id)
    state = replay(workflow_id, events)
    steps = build_context(state)
    spend = spend_of(state, events)
    if as_json:
        summary = {
            "workflow_id": workflow_id,
            "status": state.shown_status.value,
            "attempt": state.attempt,
            "max_attempts": state.max_attempts,
            "escalation_id": state.escalation_id,
            "spend": dataclasses.asdict(spend),
            "steps": [
                {"step_id": s.step_id, "tool": s.tool, "status": s.status.value, "result": s.result}
                for s in steps
            ],
        }
        click.echo(json.dumps(summary, default=str))
        return
    click.echo(
        safe(
            f"{workflow_id}: {state.shown_status.value}, "
            f"attempt {state.attempt} of {state.max_attempts}"
            + (f", escalation {state.escalation_id}" if state.escalation_id else "")
        )
    )
    if spend.turns_incurred or spend.turns_reused:  # a workflow that asked no model: no line
        click.echo(safe(f"spent: {spend.line()}"))
    for step in steps:
        # One line per step, escaped whole: a newline in a field cannot start another.
        click.echo(safe(step_line(step, full=full)))


def _state(settings: Settings, db_path: Path | None, workflow_id: str) -> WorkflowState:
    return replay(workflow_id, _events(settings, db_path, workflow_id))


def _events(settings: Settings, db_path: Path | None, workflow_id: str) -> list[ev.Event]:
    reader = reader_for(settings, db_path)
    try:
        events = list(reader.read(workflow_id).events)
    finally:
        reader.close()
    if not events:
        raise LedgerStateError(f"no workflow {workflow_id!r} in {settings.topic}")
    return events


for _command in (pause_command, unpause_command, cancel_command, restart_command):
    workflows_group.add_command(_command)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    for command in (approve_command, deny_command, approvals_group, workflows_group):
        group.add_command(command)

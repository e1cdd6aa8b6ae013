"""``workflows pause|unpause|cancel ID... [--where SQL]``: operators steer running workflows.

``pause --hold-recovery`` holds the recovery daemon too: it settles none of the paused
workflows' in-doubt steps until the unpause (a plain pause lets it settle them).

Each command appends its event to each workflow's log (naming who asked and why) through
:class:`stepledger.humanqueue.operators.Operators`, the inbox's path too.  ``--where``
selects workflows with SQL over the projection's ``workflows`` table (the snapshot
``stepledger query`` reads); each selected workflow is then judged by its own log.  A
cancel is carried through at once when ``--tools`` names the registry its compensations
need (this process becomes the workflow's runner); without it the cancel is only asked,
and ``workflows cancel ID --tools ...`` carries it through later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stepledger.cli._common import with_settings
from stepledger.cli._identity import answerer
from stepledger.cli._tools import NO_TOOLS, load_tools
from stepledger.config import Settings
from stepledger.domain.factory import EventFactory
from stepledger.errors import LedgerStateError
from stepledger.history.kafka import KafkaHistory
from stepledger.humanqueue.operators import (
    Operator,
    Operators,
    carry_cancel,
    carry_restart,
    plan_restart,
)
from stepledger.log import KafkaEventLog
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry
from stepledger.terminal import safe

WHO_HELP = "Who asks (default: your operating-system user; another name is recorded as declared)."


def _selection(fn: Any) -> Any:
    """The options every operator command takes: ids, --where, --db, --by, --reason."""
    for option in reversed(
        (
            click.argument("workflow_ids", nargs=-1),
            click.option(
                "--where",
                default=None,
                help="Also select workflows by SQL over the projection's workflows table, "
                "e.g. \"status = 'running' AND name = 'trip'\" (needs --db).",
            ),
            click.option(
                "--db",
                "db_path",
                envvar="STEPLEDGER_DB",
                type=click.Path(path_type=Path),
                help="The projection's DuckDB file (or shard directory) --where selects from.",
            ),
            click.option("--by", default=None, help=WHO_HELP),
            click.option("--reason", default="", help="Why (recorded in the event)."),
        )
    ):
        fn = option(fn)
    return fn


def selected(ids: tuple[str, ...], where: str | None, db_path: Path | None) -> list[str]:
    """The ids given, then those ``--where`` selects (each once, in that order)."""
    chosen = list(dict.fromkeys(ids))
    if where is not None:
        if db_path is None:
            raise click.UsageError("--where selects from the projection: give --db (STEPLEDGER_DB)")
        # Imported here: a bare install (no [projector] extra) steers workflows by id.
        from stepledger.projector.snapshot import readable_source
        from stepledger.readers.query import run_query

        sql = f"SELECT workflow_id FROM workflows WHERE ({where}) ORDER BY workflow_id"
        for result in run_query(readable_source(db_path), sql):
            chosen += [str(row[0]) for row in result.rows if str(row[0]) not in chosen]
    if not chosen:
        raise click.UsageError("name workflows (ID...) or select them with --where")
    return chosen


def _steer(
    settings: Settings, command: str, params: dict[str, Any], *, hold_recovery: bool = False
) -> list[str]:
    """Append the command's event to each selected workflow; print one line each."""
    ids = selected(params["workflow_ids"], params["where"], params["db_path"])
    name, auth = answerer(params["by"])
    who = Operator(name, auth.value, params["reason"])
    log, history = KafkaEventLog(settings), KafkaHistory(settings, role="reader")
    try:
        events = EventFactory(settings.fleet_id, settings.producer_id)
        steering = Operators(log, events, history)
        for decision in steering.steer(command, ids, who, hold_recovery=hold_recovery):
            click.echo(safe(decision.note))
    finally:
        log.close()
        history.close()
    return ids


@click.command("pause")
@with_settings
@_selection
@click.option(
    "--hold-recovery",
    is_flag=True,
    help="Recovery settles none of their in-doubt steps either (no hook, compensation or "
    "escalation) until unpaused; then it decides those past their deadline at once.",
)
def pause_command(settings: Settings, hold_recovery: bool, **params: Any) -> None:
    """Pause workflows: no new step starts until unpaused; a step in flight finishes.
    Recovery goes on settling their in-doubt steps unless --hold-recovery."""
    _steer(settings, "pause", params, hold_recovery=hold_recovery)


@click.command("unpause")
@with_settings
@_selection
def unpause_command(settings: Settings, **params: Any) -> None:
    """Unpause workflows: each one's next step may start."""
    _steer(settings, "unpause", params)


@click.command("cancel")
@with_settings
@_selection
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    help="Tool registry whose compensations the cancel runs (repeatable), e.g. "
    "stepledger_dev.examples.tools:registry; without it the cancel is only asked.",
)
def cancel_command(settings: Settings, tool_specs: tuple[str, ...], **params: Any) -> None:
    """Cancel workflows: no new step starts; in-doubt steps are settled by their policy,
    undoable effects undone, the rest escalated; each ends cancelled or
    compensation_incomplete."""
    ids = _steer(settings, "cancel", params)
    if not tool_specs or tool_specs == (NO_TOOLS,):
        click.echo("cancel asked; carry it through with --tools MODULE:ATTR")
        return
    tools = load_tools(tool_specs, no_entry_points=False)
    name, _ = answerer(params["by"])
    reason = params["reason"] or f"cancelled by {name}"
    with Ledger(settings, tools=tools) as ledger:
        for workflow_id in ids:
            click.echo(safe(carry_cancel(ledger, workflow_id, reason, by=name)))


@click.command("restart")
@with_settings
@click.argument("workflow_id")
@click.option("--from", "step_id", required=True, help="The step that runs anew (and all after).")
@click.option("--as", "new_id", default=None, help="The new workflow's id (default: ID.rN).")
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    help="Tool registry whose compensations undo effects at or after the step (repeatable).",
)
@click.option("--by", default=None, help=WHO_HELP)
@click.option("--reason", default="", help="Why (recorded in the old workflow's end).")
@click.option("--yes", is_flag=True, help="Do what the printed plan says (without: print it).")
def restart_command(
    settings: Settings,
    workflow_id: str,
    step_id: str,
    new_id: str | None,
    tool_specs: tuple[str, ...],
    by: str | None,
    reason: str,
    yes: bool,
) -> None:
    """Restart a workflow from a step as a new workflow: earlier steps replay their recorded
    outcomes, the step and what follows run anew.  Refused, naming them, while effects at or
    after the step stand and cannot be undone first; undoable ones are compensated first."""
    log, history = KafkaEventLog(settings), KafkaHistory(settings, role="reader")
    try:
        operators = Operators(log, EventFactory(settings.fleet_id, settings.producer_id), history)
        state = operators.state(workflow_id)
        plan = plan_restart(history, state, step_id, new_id)
    finally:
        log.close()
        history.close()
    if plan.refusal is not None:
        raise LedgerStateError(plan.refusal, workflow_id=workflow_id, step_id=step_id)
    for line in plan.lines():
        click.echo(safe(line))
    if not yes:
        click.echo("nothing done: run again with --yes to do it")
        return
    if plan.undo and (not tool_specs or tool_specs == (NO_TOOLS,)):
        raise click.UsageError("the plan compensates first: give --tools MODULE:ATTR")
    tools = load_tools(tool_specs, no_entry_points=False) if tool_specs else ToolRegistry()
    name, _ = answerer(by)
    with Ledger(settings, tools=tools) as ledger:
        done = carry_restart(ledger, plan, reason or f"restarted by {name}", by=name)
        click.echo(safe(done))

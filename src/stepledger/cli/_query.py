"""CLI commands that read the projection: query (read-only SQL) and status (one workflow)."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepledger import wire
from stepledger.cli._projector import _DB, _LAKE
from stepledger.projector.snapshot import readable_source
from stepledger.readers.lake import LakeConfig, LakeSource
from stepledger.readers.query import (
    DEFAULT_TIMEOUT_S,
    QueryResult,
    plain,
    run_query,
    to_csv,
    to_json,
    workflow_status,
)
from stepledger.terminal import safe
from stepledger.timeline import bars, timeline_svg

TABLE_WIDTH = 200
"""How wide a table is printed unless asked to be wide."""


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    for command in (query, status):
        group.add_command(command)


_LOG = click.option(
    "--topic",
    "log",
    envvar="STEPLEDGER_TOPIC",
    default=wire.STEP_LOG_TOPIC,
    show_default=True,
    help="With --lake: the step log whose tables are read.",
)


def _source(db_path: Path, lake: str | None, log: str) -> Path | LakeSource:
    """The lake's tables of the log when --lake is given, else the freshest snapshot."""
    if lake:
        return LakeSource(LakeConfig.from_env(lake), log)
    return readable_source(db_path)


@click.command()
@click.argument("sql", required=False)
@click.option("--file", "sql_file", type=click.File("r"), help="Read the SQL from a file.")
@_DB
@_LAKE
@_LOG
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json (values unrounded).")
@click.option("--csv", "as_csv", is_flag=True, help="Same as --format csv (values unrounded).")
@click.option(
    "--wide",
    is_flag=True,
    help=f"Print the table as wide as its longest values (default: cut to {TABLE_WIDTH} columns).",
)
@click.option(
    "--timeout",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Stop the query after this many seconds.",
)
def query(
    sql: str | None,
    sql_file: Any,
    db_path: Path,
    lake: str | None,
    log: str,
    output: str,
    as_json: bool,
    as_csv: bool,
    wide: bool,
    timeout: float,
) -> None:
    """Run read-only SQL on the freshest snapshot of the projection (or on the lake).

    The table rounds floats and fits 200 columns (a line on stderr says when values were
    cut); --wide, --json and --csv show every value whole.
    """

    if (sql is None) == (sql_file is None):
        raise click.UsageError("give the SQL as an argument or with --file (not both)")
    if as_json and as_csv:
        raise click.UsageError("--json and --csv are two formats: give one")
    output = "json" if as_json else "csv" if as_csv else output
    text = sql if sql is not None else sql_file.read()
    for result in run_query(_source(db_path, lake, log), text, timeout=timeout):
        _print_result(result, output, wide=wide)


def _print_result(result: QueryResult, output: str, *, wide: bool) -> None:

    if output == "csv":
        click.echo(to_csv(result), nl=False)
    elif output == "json":
        click.echo(to_json(result))
    else:
        rows = [[display(v) for v in row] for row in result.rows]
        natural = print_table(result.columns, rows, wide=wide)
        if natural > TABLE_WIDTH and not wide:
            # On stderr: the table on stdout stays what a pipe expects.
            click.echo(
                f"(the table is {natural} characters wide and was fit into {TABLE_WIDTH}: "
                "long values are wrapped or cut, ending in …; --wide, --json or --csv shows "
                "every value whole)",
                err=True,
            )


def display(value: Any) -> str:
    """A value as a person reads it in a table: floats rounded, None as empty."""
    shown = plain(value)
    if isinstance(shown, float):
        return _rounded(shown)
    return "" if shown is None else str(shown)


def _rounded(value: float) -> str:
    # Three decimals say what a person compares (seconds, rates); the exact value stays in
    # --json and --csv. Tiny and huge values keep their magnitude instead of reading as 0.
    if not math.isfinite(value) or value == 0:
        return str(value)
    if abs(value) >= 1e15 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def print_table(
    columns: list[str], rows: list[list[str]], title: str | None = None, *, wide: bool = False
) -> int:
    """Print rows as a table on the terminal (cells as plain text, never markup).

    Returns the table's natural width: one wider than :data:`TABLE_WIDTH` is printed
    narrower (long values wrapped or cut) unless ``wide``, which prints it whole.
    """
    # Text, not markup: a cell holding "[red]" or an escape sequence is shown as it is.
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(Text(safe(column)))
    for row in rows:
        table.add_row(*(Text(safe(cell)) for cell in row))
    natural = Console(width=1_000_000, file=io.StringIO()).measure(table).maximum
    Console(width=max(natural, TABLE_WIDTH) if wide else TABLE_WIDTH).print(table)
    return natural


@click.command()
@click.argument("workflow_id")
@_DB
@_LAKE
@_LOG
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--svg",
    "svg_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the workflow's timeline (steps, attempts, decisions) into this SVG file.",
)
def status(
    workflow_id: str,
    db_path: Path,
    lake: str | None,
    log: str,
    as_json: bool,
    svg_file: Path | None,
) -> None:
    """Show a workflow's steps in order with status, tool, attempts and result."""

    found = workflow_status(_source(db_path, lake, log), workflow_id)
    if svg_file is not None:
        _write_timeline(svg_file, found.workflow, found.steps)
    if as_json:
        click.echo(json.dumps({"workflow": found.workflow, "steps": found.steps}))
        return
    wf = found.workflow
    click.echo(
        safe(
            f"workflow {wf['workflow_id']}  fleet {wf['fleet_id']}  status {wf['status']}  "
            f"attempt {wf['attempt']}/{wf['max_attempts']}  steps {wf['steps']}  "
            f"in doubt {wf['in_doubt']}  anomalies {wf['anomalies']}  "
            f"last activity {wf['last_at']}"
        )
    )
    rows = [
        [
            str(s["sequence"]),
            s["step_id"],
            s["status"] + (" (in doubt)" if s["in_doubt"] else ""),
            s["tool"],
            str(s["attempt"]),
            s["resolved_by"] or "",
            _summary(s),
        ]
        for s in found.steps
    ]
    print_table(["#", "step", "status", "tool", "attempts", "resolved by", "result"], rows)


def _write_timeline(path: Path, workflow: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    title = f"{workflow['workflow_id']}: {workflow['status']}, attempt {workflow['attempt']}"
    picture = timeline_svg(title, bars(steps), now=datetime.now(UTC))
    try:
        path.write_text(picture + "\n", encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None


def _summary(step: dict[str, Any], width: int = 60) -> str:
    text = step["error"] or step["result_json"] or ""
    return text if len(text) <= width else text[: width - 1] + "…"

"""CLI commands of the projector: project, query, status, rebuild, dlq list / dlq replay."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from stepledger import wire
from stepledger.cli._common import group_options, with_settings
from stepledger.config import Settings
from stepledger.deadletters.readback import (
    parse_position,
    plan_replay,
    read_dead_letters,
    replay_letters,
    select_letters,
)
from stepledger.errors import BrokerError
from stepledger.kafka import topic_partitions
from stepledger.ops import Shutdown, configure_logging, serve_metrics
from stepledger.projector.daemon import DEFAULT_DB, ProjectorOptions, run_projector
from stepledger.projector.engine import DEFAULT_CACHE_WORKFLOWS, PROJECTOR_GROUP
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.rebuild import rebuild
from stepledger.projector.rebuild_shards import rebuild_shards
from stepledger.projector.snapshot import readable_source
from stepledger.projector.store import DEFAULT_MEMORY_LIMIT
from stepledger.readers.query import (
    DEFAULT_TIMEOUT_S,
    QueryResult,
    plain,
    run_query,
    to_csv,
    to_json,
    workflow_status,
)
from stepledger.readers.snapshots import is_shard_dir
from stepledger.terminal import safe
from stepledger.timeline import bars, timeline_svg

_DB = click.option(
    "--db",
    "db_path",
    envvar="STEPLEDGER_DB",
    default=DEFAULT_DB,
    show_default=True,
    type=click.Path(path_type=Path),
    help="The projection's DuckDB file, or a shard directory (one file per partition, "
    "for several projectors in one group); readers use the published snapshots.",
)
_EXTRA_TOPICS = click.option(
    "--extra-topic",
    "extra_topics",
    multiple=True,
    metavar="TOPIC",
    help="Also project this topic (repeatable).",
)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    for command in (project, query, status, rebuild_command, dlq):
        group.add_command(command)


@click.command()
@with_settings
@_DB
@_EXTRA_TOPICS
@click.option("--group", default=PROJECTOR_GROUP, show_default=True, help="Consumer group id.")
@click.option(
    "--batch-size",
    default=10_000,
    show_default=True,
    type=click.IntRange(1),
    help="Most records per batch (one DuckDB transaction).",
)
@click.option(
    "--batch-timeout",
    default=0.03,
    show_default=True,
    type=click.FloatRange(0.001),
    help="Seconds a batch waits to fill.",
)
@click.option(
    "--snapshot-interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds between read-only snapshots for analysts (0: only at start and stop).",
)
@click.option(
    "--cache-workflows",
    default=DEFAULT_CACHE_WORKFLOWS,
    show_default=True,
    type=click.IntRange(1),
    help="Workflow states kept in memory (others are rebuilt from stored events).",
)
@click.option(
    "--session-timeout",
    default=6.0,
    show_default=True,
    type=click.FloatRange(1.0),
    help="Consumer-group session timeout in seconds (how soon a killed member expires).",
)
@group_options
@click.option(
    "--memory-limit",
    default=DEFAULT_MEMORY_LIMIT,
    show_default=True,
    help="DuckDB memory limit for the projection, e.g. 512MB or 2GB.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics on 127.0.0.1:PORT.",
)
@click.option(
    "--log-format",
    type=click.Choice(["json", "text"]),
    default="text",
    show_default=True,
    help="Log lines on stderr as JSON or plain text (the same option as `recover`).",
)
@click.option("--log-level", default="INFO", show_default=True, help="DEBUG logs every batch.")
def project(settings: Settings, **opts: Any) -> None:
    """Project the step log into DuckDB until SIGTERM/SIGINT."""

    configure_logging(json_logs=opts["log_format"] == "json", level=opts["log_level"])
    options = ProjectorOptions(
        db_path=opts["db_path"],
        topics=(settings.topic, *opts["extra_topics"]),
        group=opts["group"],
        batch_size=opts["batch_size"],
        batch_timeout_s=opts["batch_timeout"],
        snapshot_interval_s=opts["snapshot_interval"],
        cache_workflows=opts["cache_workflows"],
        session_timeout_s=opts["session_timeout"],
        memory_limit=opts["memory_limit"],
        instance_id=opts["instance_id"],
        group_protocol=opts["group_protocol"],
    )
    metrics = ProjectorMetrics()
    serve_metrics(metrics.registry, opts["metrics_port"])
    run_projector(settings, options, shutdown=Shutdown().install(), metrics=metrics)


@click.command()
@click.argument("sql", required=False)
@click.option("--file", "sql_file", type=click.File("r"), help="Read the SQL from a file.")
@_DB
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@click.option(
    "--timeout",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Stop the query after this many seconds.",
)
def query(sql: str | None, sql_file: Any, db_path: Path, output: str, timeout: float) -> None:
    """Run read-only SQL on the freshest snapshot of the projection."""

    if (sql is None) == (sql_file is None):
        raise click.UsageError("give the SQL as an argument or with --file (not both)")
    text = sql if sql is not None else sql_file.read()
    for result in run_query(readable_source(db_path), text, timeout=timeout):
        _print_result(result, output)


def _print_result(result: QueryResult, output: str) -> None:

    if output == "csv":
        click.echo(to_csv(result), nl=False)
    elif output == "json":
        click.echo(to_json(result))
    else:
        _print_table(result.columns, [[_cell(v) for v in row] for row in result.rows])


def _cell(value: Any) -> str:

    shown = plain(value)
    return "" if shown is None else str(shown)


def _print_table(columns: list[str], rows: list[list[str]], title: str | None = None) -> None:

    # Text, not markup: a cell holding "[red]" or an escape sequence is shown as it is.
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(Text(safe(column)))
    for row in rows:
        table.add_row(*(Text(safe(cell)) for cell in row))
    Console(width=200).print(table)


@click.command()
@click.argument("workflow_id")
@_DB
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--svg",
    "svg_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the workflow's timeline (steps, attempts, decisions) into this SVG file.",
)
def status(workflow_id: str, db_path: Path, as_json: bool, svg_file: Path | None) -> None:
    """Show a workflow's steps in order with status, tool, attempts and result."""

    found = workflow_status(readable_source(db_path), workflow_id)
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
    _print_table(["#", "step", "status", "tool", "attempts", "resolved by", "result"], rows)


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


@click.command("rebuild")
@with_settings
@_DB
@_EXTRA_TOPICS
@click.option(
    "--force", is_flag=True, help="Replace the file (or rebuild the shards) if it exists."
)
@click.option(
    "--republish-dead-letters",
    is_flag=True,
    help="Dead-letter bad records again (the running projector already did).",
)
@click.option(
    "--batch-size",
    default=10_000,
    show_default=True,
    type=click.IntRange(1),
    help="Most records per transaction.",
)
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    type=click.IntRange(0),
    metavar="P",
    help="With a shard directory: rebuild only this partition's shard (repeatable).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def rebuild_command(settings: Settings, **opts: Any) -> None:
    """Rebuild a fresh projection file, or a shard directory's shards, from offset 0.

    A shard directory's shards are rebuilt in place, each under its file lock: a shard a
    live projector holds is refused.
    """
    topics = (settings.topic, *opts["extra_topics"])
    sharded = is_shard_dir(opts["db_path"])
    if opts["partitions"] and not sharded:
        raise click.ClickException("--partition needs --db naming a shard directory")
    if sharded and opts["republish_dead_letters"]:
        raise click.ClickException("--republish-dead-letters needs --db naming one file")
    with _ProgressBar(enabled=not opts["no_progress"]) as hook:
        if sharded:
            report = rebuild_shards(
                settings,
                opts["db_path"],
                topics=topics,
                partitions=opts["partitions"],
                force=opts["force"],
                batch_size=opts["batch_size"],
                progress=hook,
            )
        else:
            report = rebuild(
                settings,
                opts["db_path"],
                topics=topics,
                force=opts["force"],
                republish_dead_letters=opts["republish_dead_letters"],
                batch_size=opts["batch_size"],
                progress=hook,
            )
    click.echo(
        f"rebuilt {opts['db_path']}: {report.records} records, {report.projected} events, "
        f"{report.duplicates} duplicates, {report.dead_letters} refused, "
        f"{report.rate:,.0f} records/s{report.since()}"
    )


class _ProgressBar:
    """A rich progress bar (events/s and ETA) as a context manager yielding the hook."""

    def __init__(self, *, enabled: bool) -> None:
        self._bar = (
            Progress(
                TextColumn("rebuilding"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>9,.0f} events/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            if enabled
            else None
        )
        self._task: Any = None

    def __enter__(self) -> Any:
        if self._bar is None:
            return None
        self._bar.start()
        self._task = self._bar.add_task("rebuild", total=None, rate=0.0)
        return self._update

    def _update(self, done: int, total: int) -> None:
        assert self._bar is not None
        task = self._bar.tasks[0]
        elapsed = task.elapsed or 0.0
        rate = done / elapsed if elapsed > 0 else 0.0
        self._bar.update(self._task, completed=done, total=total, rate=rate)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


@click.group()
def dlq() -> None:
    """Inspect and replay the dead-letter topic."""


@dlq.command("list")
@with_settings
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.option("--limit", type=click.IntRange(1), help="Show at most this many (newest last).")
def dlq_list(settings: Settings, as_json: bool, limit: int | None) -> None:
    """List dead letters with where they came from, the stage and the error."""

    letters = read_dead_letters(settings)
    _announce_renamed_topic(settings)
    shown = letters[-limit:] if limit else letters
    if as_json:
        for letter in shown:
            click.echo(json.dumps(letter.summary()))
        return
    columns = ["dlq", "from", "stage", "error", "key", "bytes", "replay"]
    rows = []
    for letter in shown:
        s = letter.summary()
        rows.append(
            [
                f"{s['dlq_partition']}:{s['dlq_offset']}",
                f"{s['topic']}[{s['partition']}]@{s['offset']}",
                str(s["stage"]),
                str(s["error"])[:80],
                str(s["key"])[:40],
                str(s["value_bytes"]),
                _replay_note(letter.replayed_to, letter.replay_of),
            ]
        )
    _print_table(columns, rows, title=f"{len(letters)} dead letters in {settings.dlq_topic}")


def _replay_note(replayed_to: str | None, replay_of: str | None) -> str:
    notes = [f"replayed -> {replayed_to}"] if replayed_to else []
    if replay_of:
        notes.append(f"letter of a replay of {replay_of}")
    return "; ".join(notes)


def _announce_renamed_topic(settings: Settings) -> None:
    """One line on stderr when letters sit in the dead-letter default a refactor renamed."""
    if settings.dlq_topic != wire.DEAD_LETTER_TOPIC:
        return
    renamed = settings.model_copy(update={"dlq_topic": wire.RENAMED_DEAD_LETTER_TOPIC})
    try:
        topic_partitions(renamed, wire.RENAMED_DEAD_LETTER_TOPIC)
    except BrokerError:
        return  # not there: nothing was ever written to the wrong default
    count = len(read_dead_letters(renamed))
    if count:
        click.echo(
            f"note: {count} dead letters are in {wire.RENAMED_DEAD_LETTER_TOPIC!r}, the default "
            "for a while before 0.3.0; read them with `stepledger dlq list --dlq-topic "
            f"{wire.RENAMED_DEAD_LETTER_TOPIC}` (see CHANGELOG 0.3.0)",
            err=True,
        )


@dlq.command("replay")
@with_settings
@click.option(
    "--offset",
    "positions",
    multiple=True,
    metavar="PARTITION:OFFSET",
    help="A dead letter's own position (as `dlq list` shows it); repeatable.",
)
@click.option("--stage", help="Only letters refused at this stage (decode, schema, validate).")
@click.option("--all", "everything", is_flag=True, help="Every dead letter.")
@click.option("--to", "to_topic", help="Append to this topic instead of the original one.")
def dlq_replay(
    settings: Settings,
    positions: tuple[str, ...],
    stage: str | None,
    everything: bool,
    to_topic: str | None,
) -> None:
    """Re-append dead letters (original key, value, headers) after a fix.

    Each letter is replayed once: a letter already replayed is skipped, and so is a letter
    of a replayed record refused again unless it is named with --offset.
    """

    wanted = [parse_position(p) for p in positions]
    letters = select_letters(
        read_dead_letters(settings), positions=wanted, stage=stage, everything=everything
    )
    if not letters:
        raise click.ClickException("no dead letters match")
    plan = plan_replay(letters, named=wanted)
    landed = replay_letters(settings, plan.replay, to_topic=to_topic) if plan.replay else []
    for letter, position in zip(plan.replay, landed, strict=True):
        click.echo(
            safe(
                f"replayed {letter.name} -> "
                f"{position.topic}[{position.partition}]@{position.offset}"
            )
        )
    for letter in plan.already_replayed:
        click.echo(safe(f"skipped {letter.name}: replayed before -> {letter.replayed_to}"))
    if plan.of_replays:
        names = " ".join(f"--offset {x.name}" for x in plan.of_replays)
        click.echo(
            f"skipped {len(plan.of_replays)} letter(s) of replayed records refused again; "
            f"to replay them once more, name them: {names}"
        )

"""CLI commands of the projector: project (the daemon) and rebuild."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from stepledger.cli._common import group_options, with_settings
from stepledger.config import Settings
from stepledger.daemon.health import serve_probes
from stepledger.daemon.process import Shutdown, configure_logging
from stepledger.projector.daemon import (
    DEFAULT_DB,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    ProjectorOptions,
    run_projector,
)
from stepledger.projector.engine import DEFAULT_CACHE_WORKFLOWS
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.rebuild import rebuild
from stepledger.projector.rebuild_lake import rebuild_lake
from stepledger.projector.rebuild_shards import rebuild_shards
from stepledger.projector.store import DEFAULT_MEMORY_LIMIT
from stepledger.readers.lake import LakeConfig
from stepledger.readers.snapshots import is_shard_dir

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
_LAKE = click.option(
    "--lake",
    "lake",
    envvar="STEPLEDGER_LAKE",
    metavar="CATALOG_DSN",
    help="A DuckLake instead of --db: its PostgreSQL catalog as a libpq DSN or a "
    "postgresql:// URL (needs the [lake] extra; the bucket's key from AWS_ACCESS_KEY_ID, "
    "AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL).",
)
_DATA_PATH = click.option(
    "--data-path",
    envvar="STEPLEDGER_LAKE_DATA_PATH",
    default="",
    metavar="URL",
    help="With --lake: where its data files go, e.g. s3://bucket/stepledger/ (a new lake "
    "needs one; an existing lake remembers its own).",
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
    for command in (project, rebuild_command):
        group.add_command(command)


@click.command()
@with_settings
@_DB
@_LAKE
@_DATA_PATH
@_EXTRA_TOPICS
@click.option(
    "--group",
    envvar="STEPLEDGER_PROJECTOR_GROUP",
    help="Consumer group id [default: TOPIC.projector; with --lake TOPIC.lake-projector].",
)
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
    help="Seconds a poll waits for records (a batch commits as soon as the writer is free).",
)
@click.option(
    "--snapshot-interval",
    default=DEFAULT_SNAPSHOT_INTERVAL_S,
    show_default=True,
    type=click.FloatRange(0),
    help=(
        "Seconds between read-only snapshots of a changed projection for analysts (0: only "
        "at start and stop); stretched so that snapshots take at most a quarter of the "
        "time, a tenth while a backlog of a batch or more waits (30 s apart at most)."
    ),
)
@click.option(
    "--cache-workflows",
    default=DEFAULT_CACHE_WORKFLOWS,
    show_default=True,
    type=click.IntRange(1),
    help="Workflow states kept in memory (others are rebuilt from stored events).",
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
    help="Serve Prometheus metrics, /healthz and /readyz on 127.0.0.1:PORT.",
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
    """Project the step log into DuckDB (a file, a shard directory or a lake) until
    SIGTERM/SIGINT."""

    configure_logging(json_logs=opts["log_format"] == "json", level=opts["log_level"])
    options = ProjectorOptions(
        db_path=opts["db_path"],
        topics=(settings.topic, *opts["extra_topics"]),
        group=opts["group"] or "",
        batch_size=opts["batch_size"],
        batch_timeout_s=opts["batch_timeout"],
        snapshot_interval_s=opts["snapshot_interval"],
        cache_workflows=opts["cache_workflows"],
        session_timeout_s=opts["session_timeout"],
        memory_limit=opts["memory_limit"],
        instance_id=opts["instance_id"],
        group_protocol=opts["group_protocol"],
        lake=_lake(opts["lake"] or settings.lake, opts["data_path"]),
    )
    metrics = ProjectorMetrics()
    serve_probes(opts["metrics_port"], metrics.health, metrics.registry)
    run_projector(settings, options, shutdown=Shutdown().install(), metrics=metrics)


def _lake(catalog: str | None, data_path: str) -> LakeConfig | None:
    """The lake given by --lake or ``Settings.lake`` (None: the file mode, the default)."""
    return LakeConfig.from_env(catalog, data_path) if catalog else None


@click.command("rebuild")
@with_settings
@_DB
@_LAKE
@_DATA_PATH
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
    live projector holds is refused.  With --lake, into a fresh lake (one that holds no
    table of the step log yet).
    """
    topics = (settings.topic, *opts["extra_topics"])
    if opts["lake"]:
        _rebuild_lake(settings, topics, opts)
        return
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


def _rebuild_lake(settings: Settings, topics: tuple[str, ...], opts: dict[str, Any]) -> None:
    if opts["partitions"] or opts["force"] or opts["republish_dead_letters"]:
        raise click.ClickException(
            "--lake rebuilds every partition into a fresh lake: "
            "--partition, --force and --republish-dead-letters do not apply"
        )
    lake = LakeConfig.from_env(opts["lake"], opts["data_path"])
    with _ProgressBar(enabled=not opts["no_progress"]) as hook:
        report = rebuild_lake(
            settings, lake, topics=topics, batch_size=opts["batch_size"], progress=hook
        )
    click.echo(
        f"rebuilt the lake's tables of {settings.topic}: {report.records} records, "
        f"{report.projected} events, {report.duplicates} duplicates, "
        f"{report.dead_letters} refused, {report.rate:,.0f} records/s{report.since()}"
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

"""CLI command of the checkpointer: workflow checkpoints on the compacted checkpoint topic."""

from __future__ import annotations

import click

from stepledger.cli._common import with_settings
from stepledger.config import Settings


@click.command("checkpoint")
@with_settings
@click.option(
    "--partitions",
    default=None,
    metavar="N,N,...",
    help="The step-log partitions this process checkpoints (default: all). Split them "
    "between processes; each partition must have exactly one checkpointer at a time.",
)
@click.option("--every-events", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option(
    "--every",
    "every_s",
    type=click.FloatRange(0.1, 3600),
    default=5.0,
    show_default=True,
    help="Seconds between rounds (every changed workflow and the progress).",
)
@click.option("--once", is_flag=True, help="Catch up to the log's end, write a round and exit.")
@click.option(
    "--metrics-port",
    type=int,
    help="Serve /healthz and /readyz on 127.0.0.1:PORT (ready: a directory for each partition).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--log-level", default="INFO", show_default=True)
def checkpoint_command(
    settings: Settings,
    partitions: str | None,
    every_events: int,
    every_s: float,
    once: bool,
    metrics_port: int | None,
    log_format: str,
    log_level: str,
) -> None:
    """Fold the step log into per-workflow checkpoints (needs `stepledger init --checkpoints`)."""
    from stepledger.checkpoints.writer import Checkpointer, CheckpointOptions
    from stepledger.health import Health, serve_probes
    from stepledger.kafka import topic_partitions
    from stepledger.ops import Shutdown, configure_logging

    configure_logging(json_logs=log_format == "json", level=log_level)
    try:
        owned = None if partitions is None else [int(p) for p in partitions.split(",") if p]
    except ValueError:
        raise click.BadParameter(
            "a comma-separated list of partition numbers", param_hint="--partitions"
        ) from None
    health = Health("the checkpointer")
    serve_probes(None if once else metrics_port, health)
    topic_partitions(settings, settings.checkpoint_topic)  # one line if init made none
    options = CheckpointOptions(every_events=every_events, every_s=every_s)
    checkpointer = Checkpointer(settings, owned, options)
    try:
        if once:
            checkpointer.catch_up()
        else:
            checkpointer.run(Shutdown().install(), health)
    finally:
        checkpointer.close()
    click.echo(f"checkpointer stopped: {checkpointer.written} checkpoints written")


def register(group: click.Group) -> None:
    """Add the checkpointer's command to the CLI."""
    group.add_command(checkpoint_command)

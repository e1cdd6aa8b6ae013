"""CLI command of the checkpointer: workflow checkpoints on the compacted checkpoint topic."""

from __future__ import annotations

import click

from stepledger import wire
from stepledger.cli._common import group_options, with_settings
from stepledger.config import Settings
from stepledger.errors import ConfigError
from stepledger.kafka.consumer import GroupProtocol


@click.command("checkpoint")
@with_settings
@click.option(
    "--partitions",
    default=None,
    hidden=True,
    help="Refused: checkpointers split the partitions through their consumer group.",
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
@click.option(
    "--once",
    is_flag=True,
    help="Catch up every partition to the log's end, write a round and exit (no group).",
)
@group_options
@click.option(
    "--metrics-port",
    type=int,
    help="Serve /healthz and /readyz on 127.0.0.1:PORT (ready: a directory for each partition).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--max-seconds", type=float, hidden=True, help="Stop after this long (tests).")
def checkpoint_command(
    settings: Settings,
    partitions: str | None,
    every_events: int,
    every_s: float,
    once: bool,
    session_timeout: float,
    instance_id: str | None,
    group_protocol: GroupProtocol | None,
    metrics_port: int | None,
    log_format: str,
    log_level: str,
    max_seconds: float | None,
) -> None:
    """Fold the step log into per-workflow checkpoints (needs `stepledger init --checkpoints`).

    Run as many as you like: they split the step log's partitions through their consumer
    group, TOPIC.checkpointer, as projectors and recovery daemons do.
    """
    from stepledger.checkpoints.member import Member, membership
    from stepledger.checkpoints.writer import Checkpointer, CheckpointOptions
    from stepledger.daemon.health import Health, serve_probes
    from stepledger.daemon.process import Shutdown, configure_logging
    from stepledger.kafka import topic_partitions

    configure_logging(json_logs=log_format == "json", level=log_level)
    if partitions is not None:
        raise ConfigError(
            "--partitions is gone: checkpointers split the partitions through their consumer "
            f"group {settings.group(wire.CHECKPOINTER_ROLE)}; start one or more without it"
        )
    health = Health("the checkpointer")
    serve_probes(None if once else metrics_port, health)
    topic_partitions(settings, settings.checkpoint_topic)  # one line if init made none
    options = CheckpointOptions(every_events=every_events, every_s=every_s)
    checkpointer = Checkpointer(settings, None, options)
    try:
        if once:
            checkpointer.catch_up()
        else:
            member = membership(
                checkpointer,
                session_timeout_s=session_timeout,
                instance_id=instance_id,
                protocol=group_protocol,
            )
            Member(checkpointer, member, health).run(Shutdown().install(), max_seconds=max_seconds)
    finally:
        checkpointer.close()
    click.echo(f"checkpointer stopped: {checkpointer.written} checkpoints written")


def register(group: click.Group) -> None:
    """Add the checkpointer's command to the CLI."""
    group.add_command(checkpoint_command)

"""CLI: ``stepledger broker``, a development broker (Tansu or Apache Kafka) on loopback."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from stepledger.cli._common import with_settings
from stepledger.config import Settings, config_text, write_private
from stepledger.errors import BrokerError
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import step_log_config

if TYPE_CHECKING:
    from stepledger_dev.apache_kafka import KafkaBroker
    from stepledger_dev.broker import LocalBroker

Engine = Literal["tansu", "kafka"]


@click.command()
@click.option(
    "--engine",
    type=click.Choice(["tansu", "kafka"]),
    default="tansu",
    show_default=True,
    help="tansu: the bundled broker; kafka: Apache Kafka (KRaft; needs Java 17+, and Maven "
    "the first time to fetch its jars).",
)
@click.option("--port", type=int, default=9092, show_default=True, help="Loopback port (0: any).")
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka only: combined broker+controller nodes (3: a 3-voter quorum).",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Kafka only: keep the nodes' logs here (default: removed at exit).",
)
@click.option("--partitions", type=int, default=3, show_default=True, help="For created topics.")
@click.option(
    "--secure",
    is_flag=True,
    help="Kafka only: SASL/SCRAM-SHA-512 clients, ACLs enforced (none allows by default) and "
    "a super user whose config file is written and its path printed.",
)
@click.option(
    "--admin-config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --secure: write the super user's config file here (default: in the broker's "
    "directory, removed at exit).",
)
@with_settings
def broker(
    settings: Settings,
    engine: Engine,
    port: int,
    nodes: int,
    log_dir: Path | None,
    partitions: int,
    secure: bool,
    admin_config: Path | None,
) -> None:
    """Run a development broker on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from stepledger.daemon.process import Shutdown

    if engine == "tansu" and (nodes != 1 or log_dir is not None or secure):
        raise click.UsageError("--nodes, --log-dir and --secure need --engine kafka")
    if admin_config is not None and not secure:
        raise click.UsageError("--admin-config needs --secure")
    if port and not _port_free(port):
        raise click.ClickException(f"port {port} on 127.0.0.1 is already in use")
    shutdown = Shutdown().install()
    with _dev_broker(engine, port, nodes, log_dir, secure) as local:
        client = getattr(local, "client_settings", {})
        topics = settings.model_copy(
            update={"bootstrap": local.bootstrap, "kafka": {**settings.kafka, **client}}
        )
        ensure_topics(
            topics,
            [settings.topic, settings.dlq_topic],
            partitions=partitions,
            configs={settings.topic: step_log_config()},
        )
        click.echo(f"broker listening on {local.bootstrap}")
        if client:
            path = _write_admin_config(local, admin_config, topics)
            click.echo(f"super user's config (keep it private): {path}")
            click.echo(f"export STEPLEDGER_CONFIG={path}")
        else:
            click.echo(f"export STEPLEDGER_BOOTSTRAP={local.bootstrap}")
        while not shutdown.wait(0.5):
            if not local.running:
                raise BrokerError("the broker process exited")
    click.echo("broker stopped")


def _dev_broker(
    engine: Engine, port: int, nodes: int, log_dir: Path | None, secure: bool
) -> LocalBroker | KafkaBroker:
    from stepledger_dev.apache_kafka import KafkaBroker, Security
    from stepledger_dev.broker import LocalBroker

    if engine == "kafka":
        security = Security() if secure else None
        return KafkaBroker(nodes=nodes, port=port, log_dir=log_dir, security=security)
    return LocalBroker(port=port)


def _write_admin_config(
    local: LocalBroker | KafkaBroker, path: Path | None, settings: Settings
) -> Path:
    """Write the super user's config file (bootstrap and SASL settings), owner-only."""
    workdir = getattr(local, "workdir", None)
    target = path or Path(workdir or ".") / "admin.toml"
    return write_private(target, config_text({"bootstrap": settings.bootstrap}, settings.kafka))


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As a listener binds: connections left in TIME_WAIT do not make the port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(broker)

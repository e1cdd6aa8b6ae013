"""Options every command that talks to Kafka shares, and the error boundary of the CLI."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stepledger.config import Settings, load_settings, parse_kafka_options
from stepledger.domain import times
from stepledger.errors import StepLedgerError
from stepledger.kafka.broker import check_login, client_error
from stepledger.kafka.consumer import GROUP_PROTOCOLS
from stepledger.terminal import safe

F = TypeVar("F", bound=Callable[..., Any])


def kafka_options(fn: F) -> F:
    """Add --bootstrap, --topic, the state topics, --fleet, --config and -X to a command."""
    options = [
        click.option("--bootstrap", envvar="STEPLEDGER_BOOTSTRAP", help="Kafka HOST:PORT."),
        click.option("--topic", envvar="STEPLEDGER_TOPIC", help="The step-log topic."),
        click.option(
            "--dlq-topic",
            envvar="STEPLEDGER_DLQ_TOPIC",
            help="Dead-letter topic [default: TOPIC.deadletters].",
        ),
        click.option(
            "--checkpoint-topic",
            envvar="STEPLEDGER_CHECKPOINT_TOPIC",
            help="Compacted workflow-checkpoint topic [default: TOPIC.checkpoints].",
        ),
        click.option(
            "--recovery-state-topic",
            envvar="STEPLEDGER_RECOVERY_STATE_TOPIC",
            help="Compacted recovery changelog, the recovery daemons' state "
            "[default: TOPIC.recovery-state].",
        ),
        click.option("--fleet", "fleet_id", envvar="STEPLEDGER_FLEET_ID", help="Fleet id."),
        click.option(
            "--config",
            "config_file",
            envvar="STEPLEDGER_CONFIG",
            type=click.Path(dir_okay=False),
            help="TOML config file.",
        ),
        click.option(
            "-X",
            "kafka_opts",
            multiple=True,
            metavar="KEY=VALUE",
            help="librdkafka setting, e.g. -X security.protocol=SASL_SSL (repeatable).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


class Seconds(click.ParamType[float]):
    """A duration as ``90s``, ``1m`` or bare seconds (``6``), given as seconds."""

    name = "duration"

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            try:
                seconds = times.parse_duration(str(value)).total_seconds()
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if not self.low <= seconds <= self.high:
            self.fail(f"{value!r} is not between {self.low:g}s and {self.high:g}s", param, ctx)
        return seconds


def group_options(fn: F) -> F:
    """Add how a daemon takes part in its consumer group: --session-timeout, --instance-id
    and --group-protocol (the same three for every daemon with a group)."""
    fn = click.option(
        "--session-timeout",
        type=Seconds(1, 1800),
        default="6s",
        show_default=True,
        help="Consumer-group session timeout (6s, 1m; bare seconds too): how soon a dead "
        "member's partitions move to the others.",
    )(fn)
    fn = click.option(
        "--group-protocol",
        envvar="STEPLEDGER_GROUP_PROTOCOL",
        type=click.Choice(GROUP_PROTOCOLS),
        help="Rebalance protocol: classic (cooperative-sticky, any broker) or consumer "
        "(KIP-848, Apache Kafka 4.x) [default: -X group.protocol, else classic].",
    )(fn)
    return click.option(
        "--instance-id",
        envvar="STEPLEDGER_INSTANCE_ID",
        help="Static group membership (group.instance.id), unique per instance: a restart "
        "within the session timeout keeps its partitions.",
    )(fn)


def settings_from(params: dict[str, Any]) -> Settings:
    """Build settings once, at the edge, from a command's Kafka options (popped from params)."""
    flags = {
        "bootstrap": params.pop("bootstrap", None),
        "topic": params.pop("topic", None),
        "dlq_topic": params.pop("dlq_topic", None),
        "checkpoint_topic": params.pop("checkpoint_topic", None),
        "recovery_state_topic": params.pop("recovery_state_topic", None),
        "fleet_id": params.pop("fleet_id", None),
        "kafka": parse_kafka_options(params.pop("kafka_opts", ()) or ()),
    }
    return load_settings(flags, config_file=params.pop("config_file", None))


def with_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command so it receives ``settings`` built from its Kafka options."""

    @functools.wraps(fn)
    def wrapper(**params: Any) -> Any:
        return fn(settings=settings_from(params), **params)

    return kafka_options(wrapper)


def with_admin_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`with_settings` for an administrator's command: on an authenticated cluster a
    refused login is said at once, in one line, instead of after every request's timeout."""

    @functools.wraps(fn)
    def wrapper(**params: Any) -> Any:
        settings = settings_from(params)
        check_login(settings)
        return fn(settings=settings, **params)

    return kafka_options(wrapper)


def run_guarded(group: click.Group) -> int:
    """Run the CLI; a StepLedgerError becomes ``Error: message`` and exit code 1."""
    try:
        code = group.main(prog_name="stepledger", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        # Messages often name ids an agent wrote: escaped like every other line for people.
        shown = io.StringIO()
        exc.show(file=shown)
        for line in shown.getvalue().splitlines():
            click.echo(safe(line), err=True)
        return exc.exit_code
    except StepLedgerError as exc:
        click.echo(f"Error: {safe(exc.message)}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    except Exception as exc:
        # The client's own, raised where a client is made from settings librdkafka refuses
        # (e.g. a bad -X); anything else is a defect and keeps its traceback.
        refused = client_error(exc)
        if refused is None:
            raise
        click.echo(f"Error: Kafka client: {safe(refused)}", err=True)
        return 1
    return code if isinstance(code, int) else 0

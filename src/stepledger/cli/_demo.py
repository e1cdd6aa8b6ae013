"""CLI: ``stepledger demo``, the product's promise on the embedded default."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from stepledger.cli._common import with_settings
from stepledger.config import DEFAULT_BOOTSTRAP, Settings


@click.command()
@with_settings
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep logs, service state and DuckDB files in this directory.",
)
def demo(settings: Settings, keep: Path | None) -> None:
    """Crash an agent mid-step and watch nothing run twice.

    Starts a local broker (or uses --bootstrap), the example payments, bookings and email
    services, the projector and the recovery daemon; runs four trip workflows in an agent
    process that SIGKILLs itself mid-step; prints recovery's decisions as they happen, the
    steps table, the effects each service counted and the escalation waiting for a human.
    Topics get fresh unique names; every process the demo starts is stopped at its end.
    """
    from rich.console import Console

    from stepledger_dev.demo import DemoOptions, run_demo

    options = DemoOptions(bootstrap=_external_bootstrap(settings), keep=keep)
    # Wide enough for the steps table when the output is not a terminal (logs, CI).
    console = Console(width=None if sys.stdout.isatty() else 140)
    result = run_demo(settings, options, console)
    if result.ran_twice:
        raise click.ClickException(f"an effect ran twice: {'; '.join(result.ran_twice)}")
    if result.left_standing:
        standing = "; ".join(result.left_standing)
        raise click.ClickException(f"compensated workflows left effects standing: {standing}")
    if result.left_running:
        raise click.ClickException(f"processes left running: {result.left_running}")


def _external_bootstrap(settings: Settings) -> str | None:
    # A broker named by flag, environment or config file is used; otherwise a local one runs.
    source = click.get_current_context().get_parameter_source("bootstrap")
    named = source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return settings.bootstrap if named or settings.bootstrap != DEFAULT_BOOTSTRAP else None


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(demo)

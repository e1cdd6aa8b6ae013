"""CLI: ``stepledger demo``, the product's promise on the embedded default."""

from __future__ import annotations

import click

from stepledger.cli._common import with_settings
from stepledger.config import DEFAULT_BOOTSTRAP, Settings


@click.command()
@with_settings
def demo(settings: Settings) -> None:
    """Start a local broker (unless --bootstrap is given), record a workflow, print it back."""
    from stepledger.demo import run_demo

    external = settings.bootstrap if settings.bootstrap != DEFAULT_BOOTSTRAP else None
    run_demo(settings, external_bootstrap=external, echo=click.echo)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(demo)

"""CLI: ``stepledger inbox``, the human queue as a local web page."""

from __future__ import annotations

from pathlib import Path

import click

from stepledger.cli._common import with_settings
from stepledger.config import Settings


@click.command("inbox")
@with_settings
@click.option(
    "--db",
    "db_path",
    envvar="STEPLEDGER_DB",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("stepledger.duckdb"),
    show_default=True,
    help="The projector's DuckDB file; its published snapshot is what the inbox reads.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, help="Port (0: a free one).")
@click.option(
    "--token",
    envvar="STEPLEDGER_INBOX_TOKEN",
    help="The token every request needs (at least 16 characters); generated when unset.",
)
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Tool registry (repeatable): arguments are re-redacted with its declared secrets.",
)
def inbox_command(
    settings: Settings,
    db_path: Path,
    host: str,
    port: int,
    token: str | None,
    tool_specs: tuple[str, ...],
) -> None:
    """Serve every open escalation and pending approval as a web page (127.0.0.1 by default).

    Prints the URL to open, with its token; answers are appended to the log as the same
    events `escalations resolve`, `approve` and `deny` append.
    """
    from stepledger.inbox.server import ServeOptions, serve
    from stepledger.resolution.registry import load_registries

    tools = load_registries(tool_specs, entry_points_too=False) if tool_specs else None
    options = ServeOptions(db_path=db_path, host=host, port=port, token=token, tools=tools)

    def announce(url: str) -> None:
        click.echo(f"stepledger inbox: open {url}", err=False)
        click.echo("(the token is in the URL; Ctrl-C stops the inbox)")

    serve(settings, options, announce)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(inbox_command)

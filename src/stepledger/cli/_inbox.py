"""CLI: ``stepledger inbox``, the human queue as a local web page; ``inbox-user``, its users."""

from __future__ import annotations

from pathlib import Path

import click

from stepledger.cli._common import with_settings
from stepledger.config import Settings
from stepledger.errors import StepLedgerError

TOKEN_ON_COMMAND_LINE = (
    "--token on the command line is readable by every local user (the process list): "
    "set STEPLEDGER_INBOX_TOKEN or use --token-file"
)


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
@click.option(
    "--lake",
    metavar="CATALOG_DSN",
    help="Read the DuckLake the projectors commit to instead of --db (Settings.lake; the "
    "bucket's key from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, help="Port (0: a free one).")
@click.option(
    "--metrics-port",
    type=int,
    help="Serve /healthz and /readyz on 127.0.0.1:PORT (ready: the queue can be read).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="STEPLEDGER_INBOX_ALLOWED_HOSTS",
    metavar="NAME",
    help="A host name browsers reach the inbox by (a Service's or an ingress's; repeatable; "
    "the variable takes names separated by spaces). Others get 400.",
)
@click.option(
    "--token",
    envvar="STEPLEDGER_INBOX_TOKEN",
    help="Refused here: set STEPLEDGER_INBOX_TOKEN (at least 16 characters) or --token-file.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A file holding the shared token (its first line); generated when no token is set.",
)
@click.option(
    "--users",
    "users_path",
    envvar="STEPLEDGER_INBOX_USERS",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Users file (`stepledger inbox-user NAME`): each person opens the inbox with their "
    "own token and sees and answers, under their name, only the fleets their line names.",
)
@click.option(
    "--proxy-user-header",
    default=None,
    help="Behind a reverse proxy you trust: the header naming its user (e.g. X-Forwarded-User);"
    " requests must carry the inbox token too.",
)
@click.option(
    "--session-hours",
    type=click.FloatRange(min=0.01, max=24 * 30),
    default=8.0,
    show_default=True,
    help="How long a browser session lasts.",
)
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Tool registry (repeatable): arguments are re-redacted with its declared secrets, "
    "and an operator's restart from a step compensates first with its tools.",
)
def inbox_command(
    settings: Settings,
    db_path: Path,
    lake: str | None,
    host: str,
    port: int,
    metrics_port: int | None,
    allowed_hosts: tuple[str, ...],
    token: str | None,
    token_file: Path | None,
    users_path: Path | None,
    proxy_user_header: str | None,
    session_hours: float,
    tool_specs: tuple[str, ...],
) -> None:
    """Serve every open escalation and pending approval as a web page (127.0.0.1 by default).

    Prints the URL to open, with its token; the browser trades it for a session. Answers
    are appended to the log as the same events `escalations resolve`, `approve` and `deny`
    append.
    """
    from stepledger.inbox.server import ServeOptions, serve
    from stepledger.readers.lake import configured_lake
    from stepledger.resolution.registry import load_registries

    source = click.get_current_context().get_parameter_source("token")
    if token is not None and source is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(TOKEN_ON_COMMAND_LINE)
    if token_file is not None:
        token = _read_token(token_file)
    tools = load_registries(tool_specs, entry_points_too=False) if tool_specs else None
    options = ServeOptions(
        db_path=db_path,
        lake=configured_lake(lake or settings.lake, settings.topic),
        host=host,
        port=port,
        token=token,
        tools=tools,
        users=users_path,
        proxy_header=proxy_user_header,
        session_ttl_s=session_hours * 3600,
        metrics_port=metrics_port,
        allowed_hosts=tuple(name.strip() for name in allowed_hosts if name.strip()),
    )

    def announce(url: str) -> None:
        click.echo(f"stepledger inbox: open {url}", err=False)
        click.echo("(the token is in the URL once: the browser keeps a session; Ctrl-C stops)")

    serve(settings, options, announce)


@click.command("inbox-user")
@click.argument("name")
@click.option(
    "--users",
    "users_path",
    envvar="STEPLEDGER_INBOX_USERS",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The users file to add NAME to (created if missing).",
)
@click.option(
    "--fleet",
    "fleets",
    multiple=True,
    metavar="FLEET",
    help="A fleet whose cases NAME sees and answers (repeatable); none: every fleet.",
)
@click.option(
    "--role",
    type=click.Choice(["approver", "operator"]),
    default="approver",
    show_default=True,
    help="approver: answers escalations and approvals; operator: also workflow controls.",
)
@click.option(
    "--proxy-only",
    is_flag=True,
    help="No token of their own: the trusted proxy (--proxy-user-header) names NAME.",
)
def inbox_user_command(
    name: str, users_path: Path, fleets: tuple[str, ...], role: str, proxy_only: bool
) -> None:
    """Add NAME to an inbox users file with their fleets and role, and print their token once
    (only its hash is kept)."""
    from stepledger.inbox.auth import hash_token, new_token
    from stepledger.inbox.users import load_users, make_grant, user_line

    name = name.strip()
    if not name or len(name) > 120 or not name.isprintable():
        raise click.BadParameter("a name is 1-120 printable characters", param_hint="NAME")
    try:
        grant = make_grant(list(fleets) or None, role)
        known = load_users(users_path) if users_path.exists() else {}
    except StepLedgerError as exc:
        raise click.ClickException(exc.message) from None
    if name in known:
        raise click.ClickException(f"{name!r} is already in {users_path}: remove the line first")
    token = None if proxy_only else new_token()
    with users_path.open("a", encoding="utf-8") as out:
        out.write(user_line(name, None if token is None else hash_token(token), grant) + "\n")
    users_path.chmod(0o600)
    if token is not None:
        click.echo(f"{name}: {token}")
    click.echo(f"({name}: {grant.describe()}; {users_path} keeps only the token's hash)", err=True)


def _read_token(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read the token file {path}: {exc}") from None
    if not lines or not lines[0].strip():
        raise click.ClickException(f"the token file {path} is empty")
    return lines[0].strip()


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(inbox_command)
    group.add_command(inbox_user_command)

"""CLI: ``stepledger fleet``, fleets on a secured cluster (users, ACLs, each role's config)."""

from __future__ import annotations

from pathlib import Path

import click

from stepledger.cli._common import with_settings
from stepledger.config import Settings
from stepledger.errors import ConfigError
from stepledger.fleets import ROLES, fleet_names, role_permissions, validate_fleet_name


@click.group()
def fleet() -> None:
    """Fleets on one secured cluster: each its own topics, one user per role, prefixed ACLs.

    Every subcommand but ``acls`` runs with the super user's config (``--config``).
    """


def _name(value: str) -> str:
    try:
        return validate_fleet_name(value)
    except ConfigError as exc:
        raise click.BadParameter(exc.message) from None


@fleet.command("create")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where each role's config file is written (NAME-agent.toml, ..., owner-only).",
)
@click.option("--partitions", type=int, default=3, show_default=True)
@with_settings
def create(settings: Settings, name: str, out: Path, partitions: int) -> None:
    """Create fleet NAME's topics, one user per role and their ACLs; write each role's config.

    Again for an existing fleet: new passwords (the old config files stop working), the
    topics and ACLs kept.
    """
    from stepledger.kafka.provision import create_fleet

    for written in create_fleet(settings, name, out, partitions=partitions):
        click.echo(f"{written.role}: User:{written.user} -> {written.path}")
    names = fleet_names(name)
    click.echo(f"fleet {name}: topics {', '.join(names.topics())}; groups {names.prefix}*")


@fleet.command("acls")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
def acls(name: str) -> None:
    """Print the ACLs fleet NAME's roles need, one a line (for Terraform, Strimzi, scripts).

    Each line: principal, operation, resource type, name, and "(prefix)" for a PREFIXED
    pattern; every ACL allows, from any host.
    """
    for role in ROLES:
        for permission in role_permissions(name, role):
            click.echo(permission.describe())


@fleet.command("list")
@with_settings
def list_command(settings: Settings) -> None:
    """The fleets whose users the broker holds."""
    from stepledger.kafka.provision import list_fleets

    for name in list_fleets(settings):
        click.echo(name)


@fleet.command("show")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@with_settings
def show(settings: Settings, name: str) -> None:
    """Fleet NAME's ACLs as the broker holds them, and any the table asks for that are missing."""
    from stepledger.kafka.provision import fleet_acls

    held = fleet_acls(settings, name)
    missing = 0
    for role in ROLES:
        click.echo(f"{role}: {len(held[role])} ACLs")
        for permission in held[role]:
            click.echo(f"  {permission.describe()}")
        for permission in sorted(set(role_permissions(name, role)) - set(held[role])):
            missing += 1
            click.echo(f"  missing: {permission.describe()}")
    if missing:
        raise click.ClickException(f"fleet {name}: {missing} ACLs missing (fleet create adds them)")


@fleet.command("delete")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@with_settings
def delete(settings: Settings, name: str) -> None:
    """Remove fleet NAME's users and ACLs; its topics stay (they hold its history)."""
    from stepledger.kafka.provision import delete_fleet

    delete_fleet(settings, name)
    kept = ", ".join(fleet_names(name).topics())
    click.echo(f"fleet {name}: users and ACLs removed; topics kept: {kept}")


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(fleet)

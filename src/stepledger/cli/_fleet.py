"""CLI: ``stepledger fleet``, fleets on a secured cluster (users, ACLs, each role's config)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from stepledger.cli._common import with_admin_settings
from stepledger.config import Settings
from stepledger.errors import ConfigError
from stepledger.fleets import ROLES, fleet_names, role_permissions, validate_fleet_name
from stepledger.fleets.quotas import (
    DEFAULT_FETCH_BYTES_PER_S,
    DEFAULT_PRODUCE_BYTES_PER_S,
    Quota,
    kafka_configs_commands,
)


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


def _rate(_c: click.Context, _p: click.Parameter, value: str | None) -> float | None:
    """A rate option: a positive number, or ``none`` for no limit."""
    if value is None or value.lower() == "none":
        return None
    try:
        rate = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number (or none: no limit)") from None
    if rate <= 0:
        raise click.BadParameter(f"{value} is not above 0 (none: no limit)")
    return rate


def quota_options(defaults: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The three quota options; with ``defaults`` each starts at :class:`Quota`'s value."""
    specs = [
        ("--produce-bytes-per-s", "produce", DEFAULT_PRODUCE_BYTES_PER_S,
         "Bytes/s each of the fleet's users may produce to one broker (none: no limit)."),
        ("--fetch-bytes-per-s", "fetch", DEFAULT_FETCH_BYTES_PER_S,
         "Bytes/s each of the fleet's users may fetch from one broker (none: no limit)."),
        ("--request-percentage", "requests", "none",
         "Share of one broker's request threads per user (100: one thread; none: no limit)."),
    ]  # fmt: skip

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for flag, dest, default, text in reversed(specs):
            fn = click.option(
                flag, dest, callback=_rate, default=str(default) if defaults else None,
                show_default=defaults, help=text,
            )(fn)  # fmt: skip
        return fn

    return decorate


@fleet.command("create")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where each role's config file is written (NAME-agent.toml, ..., owner-only).",
)
@click.option("--partitions", type=int, default=3, show_default=True)
@quota_options(defaults=True)
@with_admin_settings
def create(
    settings: Settings,
    name: str,
    out: Path,
    partitions: int,
    produce: float | None,
    fetch: float | None,
    requests: float | None,
) -> None:
    """Create fleet NAME's topics, one user per role, their ACLs and quotas; write each
    role's config.

    Again for an existing fleet: new passwords (the old config files stop working), the
    topics and ACLs kept, the quota set to the options'.
    """
    from stepledger.kafka.provision import create_fleet

    quota = Quota(produce, fetch, requests)
    for written in create_fleet(settings, name, out, partitions=partitions, quota=quota):
        click.echo(f"{written.role}: User:{written.user} -> {written.path}")
    names = fleet_names(name)
    click.echo(f"fleet {name}: topics {', '.join(names.topics())}; groups {names.prefix}*")
    click.echo(f"fleet {name}: quota per user and broker: {quota.describe()}")


@fleet.command("upgrade")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@with_admin_settings
def upgrade(settings: Settings, name: str) -> None:
    """Bring fleet NAME's topics and ACLs to what this release needs (the CHANGELOG says
    when); users, passwords, config files and quotas stay, so nothing running stops."""
    from stepledger.kafka.provision import upgrade_fleet

    added = upgrade_fleet(settings, name)
    for permission in added:
        click.echo(f"added: {permission.describe()}")
    click.echo(f"fleet {name}: {len(added)} ACL(s) added; topics as this release needs them")


@fleet.command("quota")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@quota_options(defaults=False)
@with_admin_settings
def quota_command(settings: Settings, name: str, **rates: float | None) -> None:
    """Change fleet NAME's quota: each option given replaces that rate on every role's user
    (none: no limit); the rates not given stay as the broker holds them."""
    from stepledger.kafka.provision import change_fleet_quota

    context = click.get_current_context()
    changes = {
        _QUOTA_KEYS[dest]: rate
        for dest, rate in rates.items()
        if context.get_parameter_source(dest) is not ParameterSource.DEFAULT
    }
    if not changes:
        raise click.UsageError("give at least one of the quota options")
    for user, quota in change_fleet_quota(settings, name, changes).items():
        click.echo(f"User:{user}: {quota.describe()}")


#: Each quota option's Kafka name.
_QUOTA_KEYS: dict[str, str] = {
    "produce": "producer_byte_rate",
    "fetch": "consumer_byte_rate",
    "requests": "request_percentage",
}


@fleet.command("acls")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@quota_options(defaults=True)
def acls(name: str, produce: float | None, fetch: float | None, requests: float | None) -> None:
    """Print the ACLs fleet NAME's roles need, one a line, then the ``kafka-configs``
    commands that set its quota (for Terraform, Strimzi, scripts).

    Each ACL line: principal, operation, resource type, name, and "(prefix)" for a PREFIXED
    pattern; every ACL allows, from any host.  The quota lines name ``$BOOTSTRAP`` and an
    ``admin.properties`` with the super user's client settings.
    """
    for role in ROLES:
        for permission in role_permissions(name, role):
            click.echo(permission.describe())
    for line in kafka_configs_commands(name, Quota(produce, fetch, requests)):
        click.echo(line)


@fleet.command("list")
@with_admin_settings
def list_command(settings: Settings) -> None:
    """The fleets whose users the broker holds."""
    from stepledger.kafka.provision import list_fleets

    for name in list_fleets(settings):
        click.echo(name)


@fleet.command("show")
@click.argument("name", callback=lambda _c, _p, v: _name(v))
@with_admin_settings
def show(settings: Settings, name: str) -> None:
    """Fleet NAME's quotas and ACLs as the broker holds them, and any ACL the table asks for
    that is missing."""
    from stepledger.kafka.provision import fleet_acls, fleet_quotas

    held = fleet_acls(settings, name)
    for user, rates in fleet_quotas(settings, name).items():
        click.echo(f"quota User:{user}: {Quota.held(rates).describe()}")
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
@with_admin_settings
def delete(settings: Settings, name: str) -> None:
    """Remove fleet NAME's users and ACLs; its topics stay (they hold its history)."""
    from stepledger.kafka.provision import delete_fleet

    delete_fleet(settings, name)
    kept = ", ".join(fleet_names(name).topics())
    click.echo(f"fleet {name}: users and ACLs removed; topics kept: {kept}")


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(fleet)

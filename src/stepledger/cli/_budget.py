"""``stepledger budget``: a fleet's model budget on its budget topic, shown and raised.

A raise is a person's answer, appended to the budget topic as ``budget_raised`` (who, how
they were authenticated, why): every runner's later reservations are judged against the
raised limits, and a runner waiting on a refused turn (``FleetBudget(wait_s=...)``) goes on.
"""

from __future__ import annotations

import click

from stepledger.cli._common import with_settings
from stepledger.cli._identity import answerer
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.fleetbudget import FleetSpend
from stepledger.producer.fleetbudget import fleet_spend, raise_budget
from stepledger.terminal import safe

BY_HELP = "Who raises it (default: the OS user; another name is recorded as declared)."


@click.group("budget")
def budget_group() -> None:
    """Show and raise a fleet's model budget (its budget topic)."""


def _line(spend: FleetSpend) -> str:
    return (
        f"fleet {spend.fleet_id}: committed {spend.tokens} tokens, cost {spend.cost:.6g}; "
        f"raised by {spend.raised_tokens} tokens, cost {spend.raised_cost:.6g}; "
        f"{len(spend.granted)} turns granted, {len(spend.refused)} refused"
    )


@budget_group.command("show")
@with_settings
def show_command(settings: Settings) -> None:
    """What the fleet's turns committed, what was raised, how many turns were refused."""
    click.echo(safe(_line(fleet_spend(settings, settings.fleet_id))))


@budget_group.command("raise")
@with_settings
@click.option("--tokens", type=click.IntRange(min=0), default=0, help="Tokens to add.")
@click.option("--cost", type=click.FloatRange(min=0), default=0.0, help="Cost to add.")
@click.option("--by", default=None, help=BY_HELP)
@click.option("--note", default=None, help="Why.")
def raise_command(
    settings: Settings,
    tokens: int,
    cost: float,
    by: str | None,
    note: str | None,
) -> None:
    """Raise the fleet's budget: an answer in the log; waiting runners go on."""
    if not tokens and not cost:
        raise click.ClickException("give --tokens and/or --cost to add")
    name, auth = answerer(by)
    body = ev.BudgetRaised(tokens=tokens, cost=cost, by=name, auth=auth.value, note=note)
    spend = raise_budget(settings, settings.fleet_id, body)
    click.echo(safe(f"raised by {name}: {_line(spend)}"))


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(budget_group)

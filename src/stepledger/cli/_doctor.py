"""``stepledger doctor``: check a cluster before trusting it with the step log."""

from __future__ import annotations

import json

import click

from stepledger.cli._common import with_admin_settings
from stepledger.config import Settings
from stepledger.doctor.access import ACCESS, ACLS, access_findings, wildcard_findings
from stepledger.doctor.checks import Finding, check, unsafe
from stepledger.doctor.facts import gather, gather_access, gather_wildcards
from stepledger.doctor.passed import CHECKS, passed
from stepledger.terminal import safe
from stepledger.wire import stepledger_version


@click.command("doctor")
@with_admin_settings
@click.option(
    "--group",
    "groups",
    multiple=True,
    help="A consumer group to check (repeatable) "
    "[default: the settings' projector and recovery groups, TOPIC.projector and "
    "TOPIC.recovery].",
)
@click.option(
    "--max-lag", type=click.IntRange(0), default=10_000, show_default=True, help="Lag that is off."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def doctor_command(
    settings: Settings,
    groups: tuple[str, ...],
    max_lag: int,
    as_json: bool,
) -> None:
    """Say, one line each, what is unsafe or off in the cluster and what passed; exit 1 if
    anything is unsafe.

    Checks replication (factor 3, min.insync.replicas 2 on a multi-broker cluster), the step
    log's retention against checkpoints, its timestamp type, that a checkpoint topic is
    compacted, group members against partitions and versions, and the groups' lag.
    """
    facts = gather(
        settings,
        checkpoint_topic=settings.checkpoint_topic,
        groups=groups or (settings.projector_group, settings.recovery_group),
    )
    findings = check(facts, version=stepledger_version(), max_lag=max_lag)
    ok = passed(facts, findings)
    checked = list(CHECKS)
    for name, lines in _access(settings).items():
        checked.append(name)
        findings += [f for f in lines if f.level != "ok"]
        ok += [f for f in lines if f.level == "ok"]
    bad = unsafe(findings)
    if as_json:
        counts = {level: sum(f.level == level for f in findings) for level in ("unsafe", "off")}
        report = {
            "brokers": facts.brokers,
            "checked": checked,
            "findings": [f.to_json() for f in findings],
            "passed": [f.to_json() for f in ok],
            **counts,
        }
        click.echo(json.dumps(report))
    else:
        click.echo(safe(f"checked {settings.topic} on {settings.bootstrap}: {', '.join(checked)}"))
        for f in [*findings, *ok]:
            click.echo(safe(f"{f.level.upper():6} {f.check:11} {f.subject}: {f.message}"))
        tally = ", ".join(
            f"{sum(f.level == level for f in findings)} {level}" for level in ("unsafe", "off")
        )
        verdict = "unsafe: see above" if bad else "nothing unsafe found"
        click.echo(f"{verdict} ({tally}, {len(ok)} passed)")
    if bad:
        click.get_current_context().exit(1)


def _access(settings: Settings) -> dict[str, list[Finding]]:
    """The access checks these settings allow: a fleet role's own permissions (its config),
    or the ACLs that let any principal write a fleet's topics (the super user's)."""
    role = gather_access(settings)
    if role is not None:
        return {ACCESS: access_findings(role)}
    wildcards = gather_wildcards(settings)
    if wildcards is None:
        return {}
    return {ACLS: wildcard_findings(wildcards.acls, wildcards.fleets, wildcards.topics)}


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(doctor_command)

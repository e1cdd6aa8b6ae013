"""CLI commands of recovery: the daemon, its health, the human queue and reconcile."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from stepledger.cli._common import group_options, with_settings
from stepledger.cli._identity import BY_HELP, answerer
from stepledger.cli._tools import NO_TOOLS_NOTICE, load_tools, tools_options
from stepledger.config import Settings
from stepledger.daemon.health import serve_probes
from stepledger.daemon.process import Shutdown, configure_logging
from stepledger.domain import times
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory, utc_now
from stepledger.errors import ConfigError
from stepledger.history.kafka import KafkaHistory
from stepledger.humanqueue.after import what_next
from stepledger.humanqueue.answers import CLI_NOTE, Answerer, ensure_counted
from stepledger.humanqueue.escalations import read_queue, select
from stepledger.kafka.consumer import GroupProtocol
from stepledger.log import KafkaEventLog, codec_for
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.metrics import RecoveryMetrics
from stepledger.recovery.options import DaemonOptions
from stepledger.recovery.reconcile import reconcile, record_disagreements
from stepledger.terminal import safe

STATE_DIR_ENV = "STEPLEDGER_RECOVERY_STATE_DIR"
#: The state file of the local backend before 0.5.0 (left behind by an upgrade).
LEGACY_STATE_FILE = "recovery.sqlite"

logger = logging.getLogger("stepledger.recovery")

logger = logging.getLogger("stepledger.recovery")


def parse_duration(text: str) -> timedelta:
    """Parse ``90``, ``90s``, ``15m``, ``2h`` or ``7d`` into a timedelta (a click parameter)."""
    try:
        return times.parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _fleet_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    # --fleet is a settings option; here it also filters, but only when it was given.
    @functools.wraps(fn)
    def wrapper(**params: Any) -> Any:
        return fn(fleet_filter=params.get("fleet_id"), **params)

    return wrapper


@click.command("recover")
@with_settings
@tools_options
@click.option(
    "--state-dir",
    envvar=STATE_DIR_ENV,
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".stepledger-recovery"),
    show_default=True,
    help="Where the daemon writes its heartbeat file (for recover-health); its state is on "
    "the recovery changelog topic.",
)
@click.option(
    "--shared-state",
    "shared_state",
    envvar="STEPLEDGER_RECOVERY_SHARED_STATE",
    type=click.Path(file_okay=False, path_type=Path),
    hidden=True,
    help="Refused: the state is on the recovery changelog topic (see the CHANGELOG).",
)
@click.option(
    "--state-in-kafka",
    is_flag=True,
    envvar="STEPLEDGER_RECOVERY_STATE_IN_KAFKA",
    hidden=True,
    help="Deprecated, does nothing: the state is always on the recovery changelog topic.",
)
@click.option(
    "--group",
    envvar="STEPLEDGER_RECOVERY_GROUP",
    help="Consumer group [default: TOPIC.recovery].",
)
@click.option("--grace", default="2s", show_default=True, help="Wait after a deadline.")
@click.option(
    "--workers",
    envvar="STEPLEDGER_RECOVERY_WORKERS",
    default=8,
    show_default=True,
    help="Resolutions at once.",
)
@click.option(
    "--retain",
    default="24h",
    show_default=True,
    help="Keep decisions this long to judge late outcomes.",
)
@group_options
@click.option(
    "--metrics-port",
    type=int,
    help="Serve Prometheus metrics, /healthz and /readyz on 127.0.0.1:PORT.",
)
@click.option(
    "--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--max-seconds", type=float, hidden=True, help="Stop after this long (tests).")
def recover_command(
    settings: Settings,
    tool_specs: tuple[str, ...],
    no_entry_points: bool,
    state_dir: Path,
    shared_state: Path | None,
    state_in_kafka: bool,
    group: str | None,
    grace: str,
    workers: int,
    retain: str,
    session_timeout: float,
    instance_id: str | None,
    group_protocol: GroupProtocol | None,
    metrics_port: int | None,
    log_format: str,
    log_level: str,
    max_seconds: float | None,
) -> None:
    """Run the recovery daemon: resolve intents left without an outcome past their deadline."""
    configure_logging(json_logs=log_format == "json", level=log_level)
    _state_options(state_dir, shared_state, state_in_kafka)
    tools = load_tools(tool_specs, no_entry_points)
    if not len(tools):
        # The operator's choice (--tools none), said once: nothing here resolves a step.
        logger.warning(NO_TOOLS_NOTICE)
    options = DaemonOptions(
        state_dir=state_dir,
        group=group or settings.recovery_group,
        grace_s=parse_duration(grace).total_seconds(),
        workers=workers,
        retain_s=parse_duration(retain).total_seconds(),
        session_timeout_s=session_timeout,
        instance_id=instance_id,
        group_protocol=group_protocol,
    )
    metrics = RecoveryMetrics()
    serve_probes(metrics_port, metrics.health, metrics.registry)
    daemon = RecoveryDaemon(
        settings, tools, options, metrics=metrics, shutdown=Shutdown().install()
    )
    daemon.run(max_seconds=max_seconds)


@click.command("recover-health")
@with_settings
@click.option(
    "--state-dir",
    envvar=STATE_DIR_ENV,
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".stepledger-recovery"),
    show_default=True,
)
@click.option("--group", envvar="STEPLEDGER_RECOVERY_GROUP", help="[default: TOPIC.recovery]")
@click.option(
    "--max-age",
    default="10s",
    show_default=True,
    help="Healthy if the daemon's heartbeat is younger than this.",
)
def health_command(settings: Settings, state_dir: Path, group: str | None, max_age: str) -> None:
    """Exit 0 if the recovery daemon's heartbeat is fresh (prints it as JSON)."""
    path = DaemonOptions(state_dir=state_dir, group=group or settings.recovery_group).health_file
    try:
        beat = json.loads(path.read_text())
    except (OSError, ValueError):
        raise click.ClickException(f"no recovery heartbeat at {path}") from None
    age = time.time() - float(beat.get("at", 0))
    click.echo(json.dumps({**beat, "age_s": round(age, 3)}))
    if age > parse_duration(max_age).total_seconds():
        raise click.ClickException(f"recovery heartbeat is {age:.1f}s old")
    if beat.get("broker_up") is False:
        down = float(beat.get("broker_down_s", 0.0))
        raise click.ClickException(f"recovery cannot reach the broker (for {down:.1f}s)")


@click.group("escalations")
def escalations_group() -> None:
    """The human queue: steps and workflows waiting for a person's answer."""


@escalations_group.command("list")
@_fleet_filter
@with_settings
@click.option("--tool", help="Only escalations of this tool.")
@click.option("--older-than", "age", help="Only escalations open at least this long (e.g. 1h).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_command(
    settings: Settings, fleet_filter: str | None, tool: str | None, age: str | None, as_json: bool
) -> None:
    """List open escalations, oldest first (reads the whole log: O(log))."""
    now = utc_now()
    older = None if age is None else parse_duration(age)
    queue = read_queue(settings, codec_for(settings))
    found = select(queue.open(), now=now, fleet=fleet_filter, tool=tool, older_than=older)
    for item in found:
        if as_json:
            click.echo(json.dumps(item.to_json(), default=str))
        else:
            minutes = item.age(now).total_seconds() / 60
            where = f"{item.workflow_id}/{item.step_id or '-'}"
            click.echo(
                safe(
                    f"{item.escalation_id}  {minutes:7.1f}m  {item.tool or '-':20}  {where}  "
                    f"{item.reason}"
                )
            )
    if not found and not as_json:
        click.echo("no open escalations")


@escalations_group.command("show")
@with_settings
@click.argument("escalation_id")
def show_command(settings: Settings, escalation_id: str) -> None:
    """Show one escalation: the intent (secrets redacted), probes, evidence and options."""
    item = read_queue(settings, codec_for(settings)).get(escalation_id)
    click.echo(json.dumps(item.to_json(), indent=2, default=str))


@escalations_group.command("resolve")
@with_settings
@click.argument("escalation_id")
@click.option("--happened", "verdict", flag_value=Verdict.HAPPENED.value, help="It happened.")
@click.option(
    "--not-happened", "verdict", flag_value=Verdict.NOT_HAPPENED.value, help="It did not happen."
)
@click.option(
    "--compensated",
    "verdict",
    flag_value=Verdict.COMPENSATED.value,
    help="It happened and was undone.",
)
@click.option(
    "--cleared",
    "verdict",
    flag_value=Verdict.CLEARED.value,
    help="A dead-lettered workflow may run again.",
)
@click.option("--result", "result_json", help="JSON result of the effect (with --happened).")
@click.option("--note", default="", help="Why: what you checked.")
@click.option("--by", default=None, help=BY_HELP)
def resolve_command(
    settings: Settings,
    escalation_id: str,
    verdict: str | None,
    result_json: str | None,
    note: str,
    by: str | None,
) -> None:
    """Answer an escalation; the answer is appended and the step is re-judged from it."""
    if verdict is None:
        raise click.UsageError(
            "say what happened: --happened, --not-happened, --compensated or --cleared"
        )
    result = _parse_result(result_json)
    name, auth = answerer(by)
    item = read_queue(settings, codec_for(settings)).get(escalation_id)
    log = KafkaEventLog(settings)
    reader = KafkaHistory(settings, role="reader")
    try:
        # The inbox's path: checked against the log first, read back after.
        receipt = Answerer(log, _factory(settings), reader).answer_escalation(
            item.workflow_id,
            escalation_id,
            Verdict(verdict),
            by=name,
            note=note or CLI_NOTE,
            result=result,
            auth=auth,
        )
    finally:
        log.close()
        reader.close()
    ensure_counted(receipt)
    event_id = receipt.event.event_id
    # What the answer causes and who acts next: the inbox's sentence, so both say the same.
    shown = {"escalation_id": escalation_id, "verdict": verdict, "event_id": event_id}
    click.echo(json.dumps({**shown, "next": what_next(receipt.case)}))


@click.command("reconcile")
@with_settings
@tools_options
@click.option("--tool", "tool_name", required=True, help="The queryable tool to sweep.")
@click.option("--since", help="Only steps intended within this long (e.g. 24h).")
@click.option("--record", is_flag=True, help="Append each disagreement as an AnomalyObserved.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def reconcile_command(
    settings: Settings,
    tool_specs: tuple[str, ...],
    no_entry_points: bool,
    tool_name: str,
    since: str | None,
    record: bool,
    as_json: bool,
) -> None:
    """Ask a tool about every step of it in the ledger and report each disagreement."""
    tool = load_tools(tool_specs, no_entry_points).require(tool_name)
    window = None if since is None else parse_duration(since)
    report = reconcile(settings, codec_for(settings), tool, since=window, now=utc_now())
    if record and report.disagreements:
        log = KafkaEventLog(settings)
        try:
            report.recorded = record_disagreements(log, _factory(settings), report.disagreements)
        finally:
            log.close()
    for item in report.disagreements:
        click.echo(
            json.dumps(item.to_json(), default=str)
            if as_json
            else safe(
                f"{item.kind:18} {item.record.workflow_id}/{item.record.step_id} "
                f"attempt {item.record.attempt}: ledger {item.record.status.value}"
            )
        )
    summary = {
        "checked": report.checked,
        "disagreements": len(report.disagreements),
        "errors": len(report.errors),
        "recorded": report.recorded,
    }
    click.echo(
        json.dumps({"summary": summary})
        if as_json
        else " ".join(f"{k}={v}" for k, v in summary.items())
    )


def _parse_result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"--result is not JSON: {exc}") from None


def _factory(settings: Settings) -> EventFactory:
    return EventFactory(settings.fleet_id, settings.producer_id)


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    for command in (recover_command, health_command, escalations_group, reconcile_command):
        group.add_command(command)


def _state_options(state_dir: Path, shared_state: Path | None, state_in_kafka: bool) -> None:
    """The state backends before 0.5.0: refused, deprecated, or left behind (one line each)."""
    if shared_state is not None:
        raise ConfigError(
            "--shared-state is gone: the recovery state is on the changelog topic; drop the "
            "option and start the daemons (the first start replays the log; see the CHANGELOG)"
        )
    if state_in_kafka:
        logger.warning(
            "--state-in-kafka is deprecated and does nothing: the state is on the changelog topic"
        )
    if (state_dir / LEGACY_STATE_FILE).exists():
        logger.warning(
            "%s is no longer read (the state is on the changelog topic; this first start "
            "replays the log once): delete it",
            state_dir / LEGACY_STATE_FILE,
        )

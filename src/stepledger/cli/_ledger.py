"""CLI commands for the log itself: init, append, tail."""

from __future__ import annotations

import logging
from typing import IO, Any

import click

from stepledger.cli._common import with_admin_settings, with_settings
from stepledger.codec.jsonlines import Line, LineError, parse_event_lines, render_event
from stepledger.config import Settings
from stepledger.deadletters.letter import max_message_bytes
from stepledger.domain.events import Event
from stepledger.errors import CodecError, ConfigError
from stepledger.kafka import DurableProducer, Headers, ensure_topics, topic_partitions
from stepledger.kafka.gaps import Gap, LogStart
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import (
    INFINITE,
    checkpoint_topic_config,
    ensure_budget_topic,
    retention_notice,
    step_log_config,
    topic_exists,
)
from stepledger.log import codec_for, event_headers
from stepledger.terminal import safe


@click.command()
@click.option("--partitions", type=int, default=3, show_default=True)
@click.option(
    "--retention-ms",
    type=int,
    default=INFINITE,
    show_default=True,
    help="The step log's retention.ms (-1: keep everything). A finite retention needs "
    "--checkpoints: the broker would otherwise delete waiting workflows' only state.",
)
@click.option(
    "--checkpoints/--no-checkpoints",
    default=False,
    show_default=True,
    help="Also create the compacted workflow-checkpoint topic (partitioned like the step log).",
)
@click.option(
    "--adopt-unnamed-state",
    is_flag=True,
    help="Upgrading from 0.3.0: name this step log on its records in the checkpoint topic "
    "and the recovery changelog that name none (only those whose fields name this step "
    "log's topic). Run once, with no checkpointer and no recovery daemon running.",
)
@with_admin_settings
def init(
    settings: Settings,
    partitions: int,
    retention_ms: int,
    checkpoints: bool,
    adopt_unnamed_state: bool,
) -> None:
    """Create the step-log and dead-letter topics (and checkpoints) if they do not exist.

    An existing topic keeps its partitions: adding some would move existing workflows'
    keys to other partitions and break their order, so a mismatch is an error, not a fix.
    An existing topic keeps its settings too; what it says is checked and reported.
    The state topics and groups are named after the step log unless given (TOPIC.deadletters,
    TOPIC.checkpoints, TOPIC.recovery-state, TOPIC.projector, TOPIC.recovery); the budget
    topic (TOPIC.budget, one partition) orders the fleets' model spends.
    """
    try:
        configs = {settings.topic: step_log_config(retention_ms, checkpoints=checkpoints)}
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    topics = [settings.topic, settings.dlq_topic]
    if checkpoints:
        topics.append(settings.checkpoint_topic)
        configs[settings.checkpoint_topic] = checkpoint_topic_config()
    ensure_topics(settings, topics, partitions=partitions, configs=configs)
    counts = {t: len(topic_partitions(settings, t)) for t in topics}
    fewer = {t: n for t, n in counts.items() if n < partitions}
    if fewer:
        have = ", ".join(f"{t} has {n}" for t, n in fewer.items())
        raise click.ClickException(
            f"{have} partitions, not {partitions}: existing topics are not repartitioned "
            "(a workflow's events would change partition and lose their order); "
            "use a new topic for more partitions"
        )
    if checkpoints and counts[settings.checkpoint_topic] != counts[settings.topic]:
        raise click.ClickException(
            f"{settings.checkpoint_topic} has {counts[settings.checkpoint_topic]} partitions "
            f"and {settings.topic} {counts[settings.topic]}: checkpoints are partitioned "
            "like the step log; use a new checkpoint topic"
        )
    counts[settings.budget_topic] = ensure_budget_topic(settings, settings.budget_topic)
    notice = retention_notice(settings, "init")
    if notice is not None and notice.level >= logging.WARNING:
        click.echo(f"warning: {notice.message}", err=True)
    click.echo(f"topics ready: {', '.join(f'{t} ({n} partitions)' for t, n in counts.items())}")
    from stepledger.kafka.logid import resolve

    # What every state record of this deployment will name (the broker gave it the id).
    click.echo(f"step log identity: {resolve(settings)}")
    if adopt_unnamed_state:
        _adopt(settings)


def _adopt(settings: Settings) -> None:
    """Name this step log on the unnamed records of its state topics (the 0.3.0 upgrade)."""
    from stepledger.checkpoints.statetopics import adopt_unnamed, changelog_of, checkpoint_of
    from stepledger.kafka.logid import resolve

    identity = resolve(settings)
    kinds = (
        (settings.checkpoint_topic, checkpoint_of),
        (settings.recovery_state_topic, changelog_of),
    )
    for topic, belongs in kinds:
        if not topic_exists(settings, topic):
            click.echo(f"{topic}: does not exist, nothing to name")
            continue
        count = adopt_unnamed(settings, identity, topic, belongs)
        click.echo(f"{topic}: {count} records written again naming {identity}")


@click.command()
@click.argument("source", type=click.File("rb"), default="-")
@with_settings
def append(settings: Settings, source: IO[bytes]) -> None:
    """Validate and encode events given as JSON lines (FILE or -), then produce all durably.

    Every line is checked first (JSON, the event model, the Avro encoding and the producer's
    size limit); if any fails, each bad line is reported and nothing is produced.
    """
    lines, errors = parse_event_lines(source)
    records, encode_errors = encode_lines(settings, lines)
    errors = sorted([*errors, *encode_errors], key=lambda e: e.line)
    if errors:
        for error in errors:
            click.echo(safe(f"line {error.line}: {error.reason}"), err=True)
        raise click.ClickException(f"{len(errors)} invalid line(s); nothing was appended")
    topic_partitions(settings, settings.topic)
    click.echo(f"appended {produce_all(settings, records)} events to {settings.topic}")


Encoded = tuple[bytes, bytes, Headers]


def encode_lines(settings: Settings, lines: list[Line]) -> tuple[list[Encoded], list[LineError]]:
    """Each event's key, value and headers, or why its line cannot be appended."""
    codec, limit = codec_for(settings), max_message_bytes(settings, settings.topic)
    records: list[Encoded] = []
    errors: list[LineError] = []
    for line in lines:
        event = line.event
        try:
            value = codec.encode(event)
        except CodecError as exc:
            errors.append(LineError(line.line, exc.message))
            continue
        key, headers = event.workflow_id.encode(), event_headers(event)
        size = len(key) + len(value) + sum(len(k) + len(v or b"") for k, v in headers)
        if size > limit:
            errors.append(LineError(line.line, f"{size} bytes encoded, over the {limit} limit"))
            continue
        records.append((key, value, headers))
    return records, errors


def produce_all(settings: Settings, records: list[Encoded]) -> int:
    """Produce encoded events and wait until every one is acknowledged."""
    bulk: dict[str, Any] = {"linger.ms": 5}  # a bulk load: throughput, not one record's wait
    producer = DurableProducer(settings, **bulk)
    try:
        futures = [producer.send(settings.topic, *record) for record in records]
        for future in futures:
            producer.wait(future)
    finally:
        producer.close()
    return len(records)


def _head_gaps(settings: Settings) -> list[Gap]:
    """Partitions whose head the broker deleted: "from the beginning" starts later there."""
    log_start = LogStart(settings)
    try:
        wanted = dict.fromkeys(
            ((settings.topic, p) for p in topic_partitions(settings, settings.topic)), 0
        )
        return log_start.gaps(wanted)
    finally:
        log_start.close()


@click.command()
@click.option("--from-beginning", is_flag=True, help="Start at the oldest event, not the newest.")
@click.option("--follow/--no-follow", default=None, help="Keep waiting for new events.")
@click.option("--limit", type=int, default=None, help="Stop after N events.")
@click.option("--workflow", "workflow_id", default=None, help="Only this workflow's events.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (what `append` reads).")
@with_settings
def tail(
    settings: Settings,
    from_beginning: bool,
    follow: bool | None,
    limit: int | None,
    workflow_id: str | None,
    as_json: bool,
) -> None:
    """Print the topic's events; with --from-beginning it stops at the end unless --follow."""
    follow = (not from_beginning) if follow is None else follow
    notice = retention_notice(settings, "tail")
    if notice is not None and notice.level >= logging.WARNING:
        click.echo(f"warning: {notice.message}", err=True)
    if from_beginning:
        for gap in _head_gaps(settings):
            click.echo(f"warning: {gap.line('tail')}", err=True)
    shown = 0
    records = read_topic(
        settings, codec_for(settings), from_beginning=from_beginning, follow=follow
    )
    for record in records:
        if record.event is None:
            where = f"{record.position.topic}[{record.position.partition}]@{record.position.offset}"
            click.echo(safe(f"skipped undecodable record at {where}: {record.error}"), err=True)
            continue
        if workflow_id and record.event.workflow_id != workflow_id:
            continue
        click.echo(render_event(record.event) if as_json else _human(record.event))
        shown += 1
        if limit is not None and shown >= limit:
            return


def _human(event: Event) -> str:
    body = event.body.model_dump(exclude={"type"}, exclude_none=True, mode="json")
    summary = " ".join(f"{k}={v}" for k, v in body.items() if k != "arguments_digest")
    step = f"/{event.step_id}" if event.step_id else ""
    when = f"{event.occurred_at:%H:%M:%S.%f}"[:-3]
    # One event, one line: ids and fields written by agents cannot drive the terminal.
    return safe(f"{when} {event.workflow_id}{step} {event.type} {summary}")


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    for command in (init, append, tail):
        group.add_command(command)

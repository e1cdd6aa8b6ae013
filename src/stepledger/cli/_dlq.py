"""CLI commands of the dead-letter topic: dlq list, dlq replay."""

from __future__ import annotations

import json

import click

from stepledger import wire
from stepledger.cli._common import with_settings
from stepledger.cli._query import print_table
from stepledger.config import Settings
from stepledger.deadletters.readback import (
    parse_position,
    plan_replay,
    read_dead_letters,
    replay_letters,
    select_letters,
)
from stepledger.errors import BrokerError
from stepledger.kafka import topic_partitions
from stepledger.terminal import safe


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
    group.add_command(dlq)


@click.group()
def dlq() -> None:
    """Inspect and replay the dead-letter topic."""


@dlq.command("list")
@with_settings
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.option("--limit", type=click.IntRange(1), help="Show at most this many (newest last).")
def dlq_list(settings: Settings, as_json: bool, limit: int | None) -> None:
    """List dead letters with where they came from, the stage and the error."""

    letters = read_dead_letters(settings)
    _announce_earlier_defaults(settings)
    shown = letters[-limit:] if limit else letters
    if as_json:
        for letter in shown:
            click.echo(json.dumps(letter.summary()))
        return
    columns = ["dlq", "from", "stage", "error", "key", "bytes", "replay"]
    rows = []
    for letter in shown:
        s = letter.summary()
        rows.append(
            [
                f"{s['dlq_partition']}:{s['dlq_offset']}",
                f"{s['topic']}[{s['partition']}]@{s['offset']}",
                str(s["stage"]),
                str(s["error"])[:80],
                str(s["key"])[:40],
                str(s["value_bytes"]),
                _replay_note(letter.replayed_to, letter.replay_of),
            ]
        )
    print_table(columns, rows, title=f"{len(letters)} dead letters in {settings.dlq_topic}")


def _replay_note(replayed_to: str | None, replay_of: str | None) -> str:
    notes = [f"replayed -> {replayed_to}"] if replayed_to else []
    if replay_of:
        notes.append(f"letter of a replay of {replay_of}")
    return "; ".join(notes)


#: Dead-letter defaults of earlier releases (one for every step log), and when each was one.
_EARLIER_DEFAULTS = {
    wire.PREVIOUS_DEAD_LETTER_TOPIC: "up to 0.3.0 (see CHANGELOG [Unreleased])",
    wire.RENAMED_DEAD_LETTER_TOPIC: "for a while before 0.3.0 (see CHANGELOG 0.3.0)",
}


def _announce_earlier_defaults(settings: Settings) -> None:
    """One line on stderr per earlier dead-letter default holding letters of this step log,
    when the settings use today's default (named after the step log)."""
    if settings.dlq_topic != wire.derived_name(settings.topic, wire.DEAD_LETTER_ROLE):
        return
    for topic, when in _EARLIER_DEFAULTS.items():
        earlier = settings.model_copy(update={"dlq_topic": topic})
        try:
            topic_partitions(earlier, topic)
        except BrokerError:
            continue  # not there: nothing was ever written to it
        # Those defaults were shared by every step log: only this one's letters count.
        count = sum(x.origin_topic in (None, settings.topic) for x in read_dead_letters(earlier))
        if count:
            click.echo(
                f"note: {count} dead letters are in {topic!r}, the default {when}; read "
                f"them with `stepledger dlq list --dlq-topic {topic}`",
                err=True,
            )


@dlq.command("replay")
@with_settings
@click.option(
    "--offset",
    "positions",
    multiple=True,
    metavar="PARTITION:OFFSET",
    help="A dead letter's own position (as `dlq list` shows it); repeatable.",
)
@click.option("--stage", help="Only letters refused at this stage (decode, schema, validate).")
@click.option("--all", "everything", is_flag=True, help="Every dead letter.")
@click.option("--to", "to_topic", help="Append to this topic instead of the original one.")
def dlq_replay(
    settings: Settings,
    positions: tuple[str, ...],
    stage: str | None,
    everything: bool,
    to_topic: str | None,
) -> None:
    """Re-append dead letters (original key, value, headers) after a fix.

    Each letter is replayed once: a letter already replayed is skipped, and so is a letter
    of a replayed record refused again unless it is named with --offset.
    """

    wanted = [parse_position(p) for p in positions]
    letters = select_letters(
        read_dead_letters(settings), positions=wanted, stage=stage, everything=everything
    )
    if not letters:
        raise click.ClickException("no dead letters match")
    plan = plan_replay(letters, named=wanted)
    landed = replay_letters(settings, plan.replay, to_topic=to_topic) if plan.replay else []
    for letter, position in zip(plan.replay, landed, strict=True):
        click.echo(
            safe(
                f"replayed {letter.name} -> "
                f"{position.topic}[{position.partition}]@{position.offset}"
            )
        )
    for letter in plan.already_replayed:
        click.echo(safe(f"skipped {letter.name}: replayed before -> {letter.replayed_to}"))
    if plan.of_replays:
        names = " ".join(f"--offset {x.name}" for x in plan.of_replays)
        click.echo(
            f"skipped {len(plan.of_replays)} letter(s) of replayed records refused again; "
            f"to replay them once more, name them: {names}"
        )

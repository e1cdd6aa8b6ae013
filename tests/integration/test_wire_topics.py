"""The dead-letter default is named after the step log; letters on earlier defaults are
pointed to."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from stepledger import wire
from stepledger.cli import cli as main_group
from stepledger.kafka import ensure_topics
from tests.integration.projector_helpers import producer


def test_dlq_list_names_letters_left_on_earlier_defaults(make_settings: Any) -> None:
    base = make_settings(create=False)
    settings = make_settings(
        topic=base.topic, dlq_topic=wire.derived_name(base.topic, "deadletters"), create=False
    )
    earlier = [wire.PREVIOUS_DEAD_LETTER_TOPIC, wire.RENAMED_DEAD_LETTER_TOPIC]
    ensure_topics(settings, [settings.topic, settings.dlq_topic, *earlier])
    out = producer(settings)
    ours: list[tuple[str, str | bytes | None]] = [
        ("dlq_stage", b"decode"),
        ("dlq_topic", settings.topic.encode()),
    ]
    out.produce(wire.RENAMED_DEAD_LETTER_TOPIC, b"v", b"k", headers=[("dlq_stage", b"decode")])
    out.produce(wire.PREVIOUS_DEAD_LETTER_TOPIC, b"v", b"k", headers=ours)
    # Another step log's letter on the shared earlier default is not this log's.
    theirs: list[tuple[str, str | bytes | None]] = [
        ("dlq_stage", b"decode"),
        ("dlq_topic", b"another-log"),
    ]
    out.produce(wire.PREVIOUS_DEAD_LETTER_TOPIC, b"v", b"k", headers=theirs)
    assert out.flush(30) == 0
    runner = CliRunner()
    common = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    listed = runner.invoke(main_group, ["dlq", "list", *common, "--json"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == ""  # the default topic itself holds no letter
    assert "1 dead letters are in 'stepledger.deadletters.letter'" in listed.stderr
    assert "--dlq-topic stepledger.deadletters.letter" in listed.stderr
    # Counted on a topic other runs may have written to: at least ours, never theirs.
    assert "dead letters are in 'stepledger.deadletter'" in listed.stderr
    elsewhere = runner.invoke(main_group, ["dlq", "list", *common, "--dlq-topic", settings.topic])
    assert elsewhere.exit_code == 0
    assert "deadletters.letter" not in elsewhere.stderr  # a chosen topic gets no note

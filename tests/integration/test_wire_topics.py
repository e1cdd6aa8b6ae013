"""The dead-letter default is the deployed name; letters on the renamed one are pointed to."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from stepledger import wire
from stepledger.cli import cli as main_group
from stepledger.kafka import ensure_topics
from tests.integration.projector_helpers import producer


def test_dlq_list_names_letters_left_on_the_renamed_default(make_settings: Any) -> None:
    settings = make_settings(dlq_topic=wire.DEAD_LETTER_TOPIC, create=False)
    ensure_topics(
        settings, [settings.topic, wire.DEAD_LETTER_TOPIC, wire.RENAMED_DEAD_LETTER_TOPIC]
    )
    out = producer(settings)
    out.produce(wire.RENAMED_DEAD_LETTER_TOPIC, b"v", b"k", headers=[("dlq_stage", b"decode")])
    assert out.flush(30) == 0
    runner = CliRunner()
    common = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    listed = runner.invoke(main_group, ["dlq", "list", *common, "--json"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == ""  # the default topic itself holds no letter
    assert "1 dead letters are in 'stepledger.deadletters.letter'" in listed.stderr
    assert "--dlq-topic stepledger.deadletters.letter" in listed.stderr
    elsewhere = runner.invoke(main_group, ["dlq", "list", *common, "--dlq-topic", settings.topic])
    assert elsewhere.exit_code == 0
    assert "deadletters.letter" not in elsewhere.stderr  # a chosen topic gets no note

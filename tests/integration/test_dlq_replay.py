"""``dlq replay`` cannot amplify: each letter is replayed once, a replay's letter is marked."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stepledger.cli import cli as main_group
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.readback import read_dead_letters
from stepledger.kafka.reader import read_topic
from tests.integration.projector_helpers import produce_raw, projecting, wait_for
from tests.integration.test_projector import poison


def _replay(settings: Settings, *args: str) -> str:
    common = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    done = CliRunner().invoke(
        main_group, ["dlq", "replay", *common, "--dlq-topic", settings.dlq_topic, *args]
    )
    assert done.exit_code == 0, done.output
    return done.output


def _letters(settings: Settings) -> list[dict[str, object]]:
    common = ["--bootstrap", settings.bootstrap, "--dlq-topic", settings.dlq_topic]
    listed = CliRunner().invoke(main_group, ["dlq", "list", *common, "--json"])
    assert listed.exit_code == 0, listed.output
    return [json.loads(line) for line in listed.output.splitlines()]


def test_a_still_poison_record_replayed_four_times_does_not_double_the_topic(
    settings: Settings, tmp_path: Path
) -> None:
    schema_poison = [r for r in poison(settings) if r[0] == b"k-schema"]
    received = 1
    with projecting(settings, tmp_path / "p.duckdb") as daemon:
        produce_raw(settings, schema_poison)
        daemon.wait_received(received)
        wait_for(lambda: len(_letters(settings)) == 1, 30, "the first letter")
        counts, before = [], 1
        for _ in range(4):
            out = _replay(settings, "--all")
            replayed = sum(line.startswith("replayed ") for line in out.splitlines())
            received += replayed
            daemon.wait_received(received)
            # Every replayed record comes back as one more letter (it is still poison).
            wanted = before + replayed
            wait_for(lambda: len(_letters(settings)) >= wanted, 30, f"{wanted} letters")  # noqa: B023
            before = len(_letters(settings))
            counts.append(before)
        assert counts == [2, 2, 2, 2], counts
        letters = _letters(settings)
        first, second = letters
        assert first["replayed_to"] and first["replay_of"] is None
        assert second["replay_of"] == f"{settings.dlq_topic}:{first['dlq_partition']}:0"
        assert second["replayed_to"] is None
        # Named by position, a letter of a replay is replayed once; the second time is a no-op.
        name = f"{second['dlq_partition']}:{second['dlq_offset']}"
        assert _replay(settings, "--offset", name).startswith(f"replayed {name} -> ")
        daemon.wait_received(received + 1)
        wait_for(lambda: len(_letters(settings)) == 3, 30, "the third letter")
        assert _replay(settings, "--offset", name).startswith(f"skipped {name}: replayed before")
    table = CliRunner().invoke(
        main_group,
        ["dlq", "list", "--bootstrap", settings.bootstrap, "--dlq-topic", settings.dlq_topic],
    )
    assert "replayed ->" in table.output and "letter of a replay" in table.output
    on_log = [r for r in read_topic(settings, Codec(), idle_timeout=0.3) if r.key == b"k-schema"]
    assert len(on_log) == 3  # the original, one replay of it, one replay of its letter
    assert len(read_dead_letters(settings)) == 3

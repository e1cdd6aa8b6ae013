"""Poison that used to stop ``stepledger project`` at every start, against a real process."""

from __future__ import annotations

import signal
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.letter import dead_letter_info
from stepledger.kafka.reader import read_topic
from tests.fuzz_events import encode_unchecked, overflowing_clearance, with_body
from tests.integration.projector_helpers import (
    produce_events,
    produce_raw,
    snapshot_count,
    spawn_projector,
    wait_for,
)
from tests.unit.factories import factory
from tests.unit.projector_logs import TOOLS


def dead_letters(settings: Settings, count: int) -> list[dict[str, str]]:
    """The dlq_* headers of the dead letters, once there are at least ``count``."""

    def read() -> list[dict[str, str]]:
        records = read_topic(settings, Codec(), topic=settings.dlq_topic, idle_timeout=0.3)
        return [dead_letter_info(r.headers) for r in records]

    return list(
        wait_for(lambda: (found := read()) and len(found) >= count and found, 60, "letters")
    )


def test_values_past_their_columns_are_dead_lettered_and_the_projector_lives(
    make_settings: object, tmp_path: Path, src_env: dict[str, str]
) -> None:
    settings = make_settings(partitions=1)  # type: ignore[operator]
    f = factory()
    good = [
        f.workflow_started("ok", name="", attempt=1, read_only=False, max_attempts=2),
        f.intent("ok", "s", TOOLS[0], {}, sequence=0),
    ]
    foreign = encode_unchecked(with_body(good[1], attempt=2**31))
    # One batch: good events around both kinds of poison, so nothing waits for a later batch.
    produce_events(settings, good[:1])
    produce_raw(settings, [(b"ok", foreign, [])])
    produce_events(settings, [*overflowing_clearance(f, "big"), good[1]])
    db = tmp_path / "ledger.duckdb"
    proc = spawn_projector(settings, db, src_env, "--snapshot-interval", "0.2")
    try:
        wait_for(lambda: proc.poll() is not None or snapshot_count(db) == 4, 60, "4 events")
        assert proc.poll() is None, proc.communicate()[1]
        letters = dead_letters(settings, 2)
        assert sorted(x["stage"] for x in letters) == ["project", "validate"]
        assert all(x["offset"].isdigit() and x["topic"] == settings.topic for x in letters)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_a_record_too_large_to_dead_letter_whole_is_cut_to_fit_and_the_projector_lives(
    make_settings: object, tmp_path: Path, src_env: dict[str, str]
) -> None:
    settings = make_settings(partitions=1)  # type: ignore[operator]
    f = factory()
    good = [f.workflow_started("ok", name="", attempt=1, read_only=False, max_attempts=2)]
    # Just under the producer's limit as it is; over it once the dlq_* headers are added.
    junk = b"\x07" * 999_400
    produce_raw(settings, [(b"junk", junk, [("h", b"x" * 500)])])
    produce_events(settings, good)
    db = tmp_path / "ledger.duckdb"
    proc = spawn_projector(settings, db, src_env, "--snapshot-interval", "0.2")
    try:
        wait_for(lambda: proc.poll() is not None or snapshot_count(db) == 1, 60, "the good event")
        assert proc.poll() is None, proc.communicate()[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    letters = list(read_topic(settings, Codec(), topic=settings.dlq_topic, idle_timeout=0.3))
    assert len(letters) == 1
    info = dead_letter_info(letters[0].headers)
    assert info["offset"] == "0" and info["topic"] == settings.topic and info["stage"] == "decode"
    assert "999400" in info["truncated"] and len(info["value_sha256"]) == 64
    value = letters[0].value or b""
    assert 900_000 < len(value) < len(junk) and junk.startswith(value)

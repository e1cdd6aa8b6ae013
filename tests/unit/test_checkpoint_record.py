"""The workflow checkpoint record, its schema and the step log's topic settings (pure)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stepledger.checkpoints.record import PROGRESS_KEY, WorkflowCheckpoint, decode, encode
from stepledger.errors import CodecError, ConfigError
from stepledger.kafka.gaps import Gap
from stepledger.kafka.topics import Retention, step_log_config

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "stepledger.WorkflowCheckpoint.avsc"


def sample() -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        "wf-1", "stepledger.events", 2, 41, "running", 1, 2, (b"\xc3\x01one", b"\xc3\x01two")
    )


def test_a_checkpoint_round_trips_and_the_same_input_is_the_same_bytes() -> None:
    checkpoint = sample()
    assert decode(encode(checkpoint)) == checkpoint
    assert encode(checkpoint) == encode(dataclasses.replace(checkpoint))
    progress = WorkflowCheckpoint(None, "stepledger.events", 2, 99)
    assert decode(encode(progress)) == progress and progress.key == PROGRESS_KEY
    assert checkpoint.key == b"wf-1"


def test_the_record_has_the_schema_fields_each_with_a_doc() -> None:
    schema = json.loads(SCHEMA.read_text())
    names = [f["name"] for f in schema["fields"]]
    assert names == [f.name for f in dataclasses.fields(WorkflowCheckpoint)]
    assert all(f.get("doc") for f in schema["fields"])


def test_bad_bytes_and_out_of_range_ints_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        decode(b"\x00\x00\x00\x00\x01xx")
    with pytest.raises(CodecError):
        decode(encode(sample())[:12])
    with pytest.raises(CodecError):
        encode(dataclasses.replace(sample(), attempt=2**31))


def test_a_finite_retention_needs_checkpoints() -> None:
    assert step_log_config() == {
        "retention.ms": "-1",
        "cleanup.policy": "delete",
        "message.timestamp.type": "LogAppendTime",
    }
    with pytest.raises(ConfigError, match="needs checkpoints"):
        step_log_config(86_400_000)
    assert step_log_config(86_400_000, checkpoints=True)["retention.ms"] == "86400000"
    with pytest.raises(ConfigError):
        step_log_config(0, checkpoints=True)


def test_what_counts_as_deleting() -> None:
    assert Retention("t", 604_800_000, "delete").deletes
    assert Retention("t", 604_800_000, "compact,delete").deletes
    assert not Retention("t", -1, "delete").deletes
    assert not Retention("t", 604_800_000, "compact").deletes
    assert not Retention("t", None, None).deletes


def test_a_gap_says_what_was_lost_in_one_line() -> None:
    gap = Gap("events", 1, 30, 100)
    assert gap.records_lost == 70
    line = gap.line("recovery")
    assert "\n" not in line and "events[1]" in line and "70 records lost" in line

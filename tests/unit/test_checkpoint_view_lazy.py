"""The checkpoint view keeps records as bytes and decodes only the checkpoints asked for (pure).

``covered_offset_of`` reads a record's covered offset from its first fields; it must agree
with a full decode on every record, and refuse what a full decode refuses there.
"""

from __future__ import annotations

import dataclasses

import pytest

from stepledger.checkpoints import points, view
from stepledger.checkpoints.record import WorkflowCheckpoint, covered_offset_of, decode, encode
from stepledger.errors import CodecError


def checkpoint(workflow_id: str | None = "wf-1", covered: int = 41) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_id, "stepledger.events", 2, covered, "running", 1, 2, (b"\xc3\x01one",), (7,)
    )


@pytest.mark.parametrize(
    "record",
    [
        checkpoint(),
        checkpoint(None, 0),  # a partition's progress: the null branch
        checkpoint("w" * 300, 2**40 + 5),  # multi-byte lengths and offsets
        checkpoint("é-ünïcode", 63),
        checkpoint("wf", 64),  # the first offset whose zig-zag needs two bytes
        dataclasses.replace(checkpoint(), partition=2**31 - 1, topic="t" * 200),
    ],
)
def test_the_covered_offset_read_from_the_first_fields_is_the_decoded_one(
    record: WorkflowCheckpoint,
) -> None:
    data = encode(record)
    assert covered_offset_of(data) == decode(data).covered_offset == record.covered_offset


def test_what_is_not_a_checkpoint_is_refused() -> None:
    data = encode(checkpoint("w" * 300))
    for bad in (None, b"", b"\x00\x00garbage", data[:14], data[:10] + b"\x04" + data[11:]):
        with pytest.raises(CodecError):
            covered_offset_of(bad)


def test_the_newest_record_per_key_wins_and_is_decoded_only_when_asked() -> None:
    latest: dict[bytes, points.Held] = {}
    view.CheckpointView._take(latest, b"wf-1", encode(checkpoint(covered=50)))
    view.CheckpointView._take(latest, b"wf-1", encode(checkpoint(covered=40)))  # an older rewrite
    view.CheckpointView._take(latest, b"wf-2", encode(checkpoint("wf-2", 10)))
    assert not view.CheckpointView._take(latest, b"bad", b"\x00not a checkpoint")  # skipped
    assert sorted(latest) == [b"wf-1", b"wf-2"]
    assert all(held.decoded is None for held in latest.values())
    found = view._checkpoint(latest, b"wf-1")
    assert found is not None and found.covered_offset == 50
    assert latest[b"wf-2"].decoded is None
    view.CheckpointView._take(latest, b"wf-2", None)  # a tombstone
    assert view._checkpoint(latest, b"wf-2") is None


def test_a_newest_record_that_does_not_decode_counts_as_no_checkpoint() -> None:
    good = encode(checkpoint(covered=50))
    # Its first fields read, its values do not: the reader then refuses rather than guess.
    broken = good[: len(good) - 3]
    latest: dict[bytes, points.Held] = {}
    view.CheckpointView._take(latest, b"wf-1", encode(checkpoint(covered=20)))
    view.CheckpointView._take(latest, b"wf-1", broken)
    assert view._checkpoint(latest, b"wf-1") is None
    assert b"wf-1" not in latest

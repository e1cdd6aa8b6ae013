"""The workflow checkpoint record and its codec (``schemas/stepledger.WorkflowCheckpoint.avsc``).

A checkpoint carries a workflow's step-log values up to an offset, byte for byte, plus a
summary of what the one fold (:func:`stepledger.domain.state.replay`) makes of them.  The
state a reader gets back is therefore the fold of those values: there is no second
serialisation of the state that could drift from the fold or fail to load (invariant 10),
and a checkpoint written twice for the same covered offset is the same bytes.

Values are framed as Avro single-object encoding (``C3 01`` + the CRC-64-AVRO fingerprint
of this schema + the body), as step-log events are without a registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepledger.codec import read_record, record_prefix, write_record
from stepledger.errors import CodecError

NAME = "stepledger.WorkflowCheckpoint"
#: The key of a partition's progress record (no workflow id starts with a NUL byte).
PROGRESS_KEY = b"\x00progress"
#: Avro ``int`` bounds (fastavro writes out-of-range values unchecked).
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class WorkflowCheckpoint:
    """A workflow's log up to ``covered_offset``, or (no workflow id) a partition's progress."""

    workflow_id: str | None
    """The workflow; None for the partition's progress record."""
    topic: str
    """The step-log topic the checkpoint was folded from."""
    partition: int
    """The step-log partition (the checkpoint lives in the same partition number)."""
    covered_offset: int
    """The highest step-log offset folded in: the tail is read after it."""
    status: str = ""
    """The workflow's status as the fold says; empty for progress."""
    attempt: int = 0
    """The workflow's attempt count as the fold says."""
    steps: int = 0
    """How many steps the fold knows."""
    events: tuple[bytes, ...] = field(default_factory=tuple)
    """The workflow's step-log values up to ``covered_offset``, in log order."""
    offsets: tuple[int, ...] = field(default_factory=tuple)
    """The step-log offset of each value of ``events`` (empty: not known)."""

    @property
    def key(self) -> bytes:
        """The record key: the workflow id, or the progress key."""
        return PROGRESS_KEY if self.workflow_id is None else self.workflow_id.encode()


def _prefix() -> bytes:
    return record_prefix(NAME)


def encode(checkpoint: WorkflowCheckpoint) -> bytes:
    """The framed Avro bytes of a checkpoint (bounded ints are checked first)."""
    for name in ("partition", "attempt", "steps"):
        value = getattr(checkpoint, name)
        if not 0 <= value <= _INT_MAX:
            raise CodecError(f"checkpoint {name}={value} does not fit an Avro int")
    record = {
        "workflow_id": checkpoint.workflow_id,
        "topic": checkpoint.topic,
        "partition": checkpoint.partition,
        "covered_offset": checkpoint.covered_offset,
        "status": checkpoint.status,
        "attempt": checkpoint.attempt,
        "steps": checkpoint.steps,
        "events": list(checkpoint.events),
        "offsets": list(checkpoint.offsets),
    }
    return write_record(NAME, record)


def decode(data: bytes | None) -> WorkflowCheckpoint:
    """The checkpoint in framed bytes; anything else raises CodecError."""
    record = read_record(NAME, data, "checkpoint")
    return WorkflowCheckpoint(
        workflow_id=record["workflow_id"],
        topic=record["topic"],
        partition=record["partition"],
        covered_offset=record["covered_offset"],
        status=record["status"],
        attempt=record["attempt"],
        steps=record["steps"],
        events=tuple(record["events"]),
        offsets=tuple(record["offsets"]),
    )


def covered_offset_of(data: bytes | None) -> int:
    """The covered offset of framed checkpoint bytes, read without decoding the values.

    The schema's first fields are ``workflow_id`` (a union: null or string), ``topic``,
    ``partition`` and ``covered_offset``; a reader of the checkpoint topic compares
    covered offsets of every record it reads but needs the values of one workflow only.
    Raises CodecError where :func:`decode` would fail to read these fields.
    """
    prefix = _prefix()
    if not data or not data.startswith(prefix):
        raise CodecError("not a WorkflowCheckpoint in single-object encoding")
    at = len(prefix)
    branch, at = _varint(data, at)
    if branch not in (0, 1):
        raise CodecError(f"undecodable checkpoint: workflow_id union branch {branch}")
    if branch == 1:
        at = _skip_string(data, at)
    at = _skip_string(data, at)  # topic
    _, at = _varint(data, at)  # partition
    covered, _ = _varint(data, at)
    return covered


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """An Avro zig-zag varint at ``at``: its value and the offset after it."""
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise CodecError("undecodable checkpoint: truncated or overlong varint")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def _skip_string(data: bytes, at: int) -> int:
    length, at = _varint(data, at)
    if length < 0 or at + length > len(data):
        raise CodecError("undecodable checkpoint: string past the end")
    return at + length

"""Schema-valid random events for fuzzing every consumer of the log (projector, tail, recovery).

Records are drawn from the Avro contract itself (``schemas/``), not from the pydantic models,
so they are what any producer, old or foreign, could put on the wire: integers at and past
their type's range (fastavro writes an ``int`` of any size unchecked), empty and huge strings,
timestamps at the edges of what a reader can hold and past them, every event kind in random
order for a few workflow and step ids (an intent followed by ``workflow_started`` with
``read_only`` and a later attempt for the same step), duplicated event ids.  Seeded:
the same seed gives the same records.
"""

from __future__ import annotations

import io
import random
import string
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro

from stepledger.codec import SINGLE_OBJECT_MAGIC, Codec, single_object_fingerprint, to_record
from stepledger.domain import events as ev
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory

Record = dict[str, Any]

# The Avro ranges, spelled out here: the generator follows the wire contract, not the models.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EDGE_INTS = (0, 1, 2, -1, INT32_MAX, INT32_MIN, INT32_MAX - 1)
_PAST_INTS = (INT32_MAX + 1, INT32_MIN - 1, 2**40, INT64_MAX, INT64_MIN)
_EDGE_TIMES = (
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    _EPOCH,
    datetime(2026, 1, 1, tzinfo=UTC),
)
_PAST_MILLIS = (INT64_MAX, INT64_MIN, 253402300800000, -62135596800001)


def encode_unchecked(record: Record, codec: Codec | None = None) -> bytes:
    """Single-object Avro bytes of a record as fastavro writes it: no pydantic, no range check."""
    schema = (codec or Codec()).schema
    buf = io.BytesIO()
    buf.write(SINGLE_OBJECT_MAGIC + single_object_fingerprint(schema))
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def with_body(event: ev.Event, **body: Any) -> Record:
    """An event's wire record with some body fields replaced (e.g. ``attempt=2**31``)."""
    record = to_record(event)
    name, fields = record["body"]
    record["body"] = (name, {**fields, **body})
    return record


def overflowing_clearance(factory: EventFactory, workflow_id: str) -> list[ev.Event]:
    """Valid events whose fold computes max_attempts past 32 bits (a cleared dead letter)."""
    cleared = ev.EscalationResolved(escalation_id="E1", verdict=Verdict.CLEARED, by="ops")
    return [
        factory.workflow_started(
            workflow_id, name="n", attempt=INT32_MAX, read_only=False, max_attempts=INT32_MAX
        ),
        factory.envelope(
            workflow_id,
            None,
            ev.WorkflowDeadLettered(attempt=INT32_MAX, reason="limit", escalation_id="E1"),
        ),
        factory.envelope(workflow_id, None, cleared),
    ]


class EventFuzzer:
    """Draws envelope records from the contract, mostly sensible, sometimes at or past the edges.

    ``past_range`` is the chance that a number is outside what its type (or a reader) can
    hold; ``huge`` the chance that a string is ~``huge_size`` characters.
    """

    def __init__(
        self,
        seed: int,
        *,
        workflows: int = 4,
        steps: int = 3,
        past_range: float = 0.02,
        huge: float = 0.002,
        huge_size: int = 100_000,
        codec: Codec | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.codec = codec or Codec()
        self.workflows = [f"wf-{seed}-{i}" for i in range(workflows)]
        self.steps = [f"s{i}" for i in range(steps)]
        self.past_range, self.huge, self.huge_size = past_range, huge, huge_size
        self._named = _named_types(self.codec.schema)
        self._event_ids: list[str] = []
        self._count = 0

    def records(self, count: int) -> Iterator[Record]:
        """``count`` envelope records."""
        for _ in range(count):
            yield self.record()

    def values(self, count: int) -> Iterator[bytes]:
        """``count`` encoded records (what a producer appends), unchecked."""
        for record in self.records(count):
            yield encode_unchecked(record, self.codec)

    def record(self) -> Record:
        """One envelope record."""
        self._count += 1
        rng = self.rng
        if self._event_ids and rng.random() < 0.03:
            event_id = rng.choice(self._event_ids)  # a duplicate, or a clash of ids
        else:
            event_id = f"e{self._count}-{rng.getrandbits(32):08x}"
            self._event_ids.append(event_id)
        body_name = rng.choice([b["name"] for b in self._envelope_field("body")["type"]])
        return {
            "event_id": event_id,
            "workflow_id": rng.choice(self.workflows),
            "step_id": None if rng.random() < 0.1 else rng.choice(self.steps),
            "fleet_id": self._string(short=True) or "fleet",
            "producer_id": "fuzz",
            "occurred_at": self._time(),
            "body": (body_name, self._fields(self._named[body_name])),
        }

    def _envelope_field(self, name: str) -> dict[str, Any]:
        return next(f for f in self.codec.schema["fields"] if f["name"] == name)

    def _fields(self, schema: dict[str, Any]) -> Record:
        return {f["name"]: self._value(f["type"], f["name"]) for f in schema["fields"]}

    def _value(self, kind: Any, name: str) -> Any:
        rng = self.rng
        if isinstance(kind, list):
            if "null" in kind and rng.random() < 0.3:
                return None
            return self._value(rng.choice([k for k in kind if k != "null"]), name)
        if isinstance(kind, str) and kind in self._named:
            kind = self._named[kind]
        if isinstance(kind, dict):
            if kind.get("logicalType") == "timestamp-millis":
                return self._time()
            if kind["type"] == "enum":
                return rng.choice(kind["symbols"])
            if kind["type"] == "record":
                return self._fields(kind)
            kind = kind["type"]
        return self._primitive(kind, name)

    def _primitive(self, kind: str, name: str) -> Any:
        rng = self.rng
        if kind == "string":
            return self._string(short=name.endswith("_id") or name == "tool")
        if kind == "boolean":
            # A pause holding recovery is an operator's rare incident command: one in two
            # would hold most fuzzed workflows for good, and nothing would reach a resolver.
            return rng.random() < (0.02 if name == "hold_recovery" else 0.5)
        if kind == "double":
            return rng.choice([0.0, -1.5, 1e308, float("inf")])
        if kind in ("int", "long"):
            if rng.random() < self.past_range:
                return rng.choice(_PAST_INTS if kind == "int" else (INT64_MAX, INT64_MIN))
            if rng.random() < 0.1:
                return rng.choice(_EDGE_INTS)
            return rng.randint(1, 4)
        raise AssertionError(f"no generator for Avro type {kind!r}")

    def _string(self, *, short: bool = False) -> str:
        rng = self.rng
        roll = rng.random()
        if not short and roll < self.huge:
            return rng.choice(string.ascii_letters) * self.huge_size
        if roll < 0.1:
            return ""
        if roll < 0.15:
            return rng.choice(["\x00", "é✓😀", "'; DROP TABLE steps; --", "\u202e", '{"a":']) * 3
        if short:
            return rng.choice(["a", "b", "c", "pay", "book"])
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 40)))

    def _time(self) -> Any:
        rng = self.rng
        if rng.random() < self.past_range:
            return rng.choice(_PAST_MILLIS)  # fastavro writes an int as raw millis
        if rng.random() < 0.05:
            return rng.choice(_EDGE_TIMES)
        return _EDGE_TIMES[3] + timedelta(milliseconds=self._count * 7)


def _named_types(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every named type (record, enum) the parsed envelope schema defines, by full name."""
    found: dict[str, dict[str, Any]] = {}

    def walk(kind: Any) -> None:
        if isinstance(kind, list):
            for item in kind:
                walk(item)
        elif isinstance(kind, dict):
            if "name" in kind and kind.get("type") in ("record", "enum"):
                found[kind["name"]] = kind
            for field in kind.get("fields", []):
                walk(field["type"])

    walk(schema)
    return found

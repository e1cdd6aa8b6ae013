"""The compiled Avro writer writes fastavro's bytes, refuses what it cannot write, and the
codec keeps fastavro for a schema it does not know."""

from __future__ import annotations

import copy
import io
import random
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest

from stepledger import _writer
from stepledger.codec import _BODY_BY_NAME, Codec, load_envelope_schema, to_record
from stepledger.domain import events as ev
from stepledger.errors import CodecError, EventValidationError
from tests.fuzz_events import EventFuzzer
from tests.unit.test_codec import sample_events


def _fastavro(schema: Any, value: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return buf.getvalue()


def _fastavro_event(codec: Codec, event: ev.Event) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.schema, to_record(event))
    return buf.getvalue()


def test_every_event_kind_is_written_as_fastavro_writes_it() -> None:
    codec = Codec()
    prefix = codec.prefix
    assert codec.encode(sample_events()[0]).startswith(prefix)
    kinds = set()
    for value in EventFuzzer(24, codec=codec, huge=2).values(2000):
        try:
            event = codec.decode(value)  # the valid ones: the models' values
        except (CodecError, EventValidationError):
            continue
        kinds.add(event.type)
        assert codec.encode(event) == prefix + _fastavro_event(codec, event)
    assert len(kinds) == len(_BODY_BY_NAME)


_EDGES = [0, 1, -1, 63, 64, -64, -65, 1023, 1024, 8191, 8192, 16383, 16384, 2**31 - 1, -(2**31)]


def test_longs_and_times_at_every_width() -> None:
    rng = random.Random(7)
    longs = _EDGES + [2**63 - 1, -(2**63)] + [rng.randint(-(2**63), 2**63 - 1) for _ in range(2000)]
    longs += [rng.randint(0, 4 * 10**12) for _ in range(2000)]  # times as millis
    for value in longs:
        assert _writer.write_long(value) == _fastavro("long", value), value
    millis = {"type": "long", "logicalType": "timestamp-millis"}
    first, last = (
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    )
    times = [
        first,
        last,
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC),
    ]
    span = int((last - first) / timedelta(microseconds=1))
    for _ in range(3000):
        at = first + timedelta(microseconds=rng.randint(0, span))
        times += [at, at.replace(microsecond=at.microsecond // 1000 * 1000)]
    for at in times:
        assert _writer.write_millis(at) == _fastavro(millis, at), at
    assert _writer.write_millis(1_700_000_000_000) == _fastavro(millis, 1_700_000_000_000)


def test_strings_and_bytes_of_every_length_class() -> None:
    for size in (0, 1, 511, 512, 1023, 1024, 8191, 8192, 70_000):
        text = "é" * (size // 2) + "x" * (size % 2)
        assert _writer.write_string(text) == _fastavro("string", text)
        assert _writer.write_bytes(b"b" * size) == _fastavro("bytes", b"b" * size)


def test_a_naive_time_or_a_wrong_value_is_a_codec_error() -> None:
    codec = Codec()
    event = sample_events()[1]
    naive = event.model_copy(update={"occurred_at": datetime(2026, 1, 1)})
    with pytest.raises(CodecError, match="naive"):
        codec.encode(naive)
    wrong = event.model_copy(update={"workflow_id": 7})
    with pytest.raises(CodecError):
        codec.encode(wrong)
    body = event.body.model_copy(update={"effect": "not-a-symbol"})
    with pytest.raises(CodecError):
        codec.encode(event.model_copy(update={"body": body}))


def _with_double(schema: dict[str, Any]) -> dict[str, Any]:
    """The envelope with a field of a type the compiler does not write (a double, defaulted)."""
    plain = copy.deepcopy(dict(schema))
    plain.pop("__fastavro_parsed", None)
    plain.pop("__named_schemas", None)
    plain["fields"] = [*plain["fields"], {"name": "weight", "type": "double", "default": 0.5}]
    parsed = fastavro.parse_schema(plain)
    assert isinstance(parsed, dict)
    return dict(parsed)


def test_a_schema_it_cannot_write_is_refused_and_the_codec_keeps_fastavro() -> None:
    schema = _with_double(load_envelope_schema())
    with pytest.raises(_writer.Unsupported, match="double"):
        _writer.compile_writer(schema, _BODY_BY_NAME)
    with pytest.raises(_writer.Unsupported):
        _writer.compile_writer({"type": "enum", "name": "E", "symbols": ["a"]}, {})
    codec = Codec(schema)
    event = sample_events()[1]
    # The model has no ``weight``: fastavro writes the field's default, as it always did.
    expected = _fastavro(schema, {**to_record(event), "weight": 0.5})
    assert codec.encode(event)[10:] == expected


def test_a_union_member_with_no_class_is_refused() -> None:
    with pytest.raises(_writer.Unsupported, match="no class"):
        _writer.compile_writer(load_envelope_schema(), {})


def _unchecked(event: ev.Event, **body: Any) -> ev.Event:
    """``event`` with body values no validation saw (as ``trusted`` builds them)."""
    changed = ev.trusted(type(event.body), {**event.body.__dict__, **body})
    return ev.trusted(ev.Event, {**event.__dict__, "body": changed})


def test_a_value_fastavro_refuses_is_a_codec_error_not_bytes() -> None:
    """Wrong bytes are worse than an error: a long past 64 bits was written as an 11-byte
    varint no reader takes, a non-bool in a ``[null, boolean]`` union as its truthiness."""
    codec = Codec()
    intent = next(e for e in sample_events() if e.type == "step_intended")
    wrong: list[dict[str, Any]] = [
        {"sequence": 2**63},
        {"epoch": -(2**63) - 1},
        {"deadline": 2**64},
        {"repeatable": "no"},
        {"undoable": 1},
    ]
    fallback = Codec(_with_double(load_envelope_schema()))  # fastavro's OverflowError too
    for values in wrong:
        event = _unchecked(intent, **values)
        with pytest.raises((ValueError, OverflowError)):
            _fastavro_event(codec, event)
        with pytest.raises(CodecError):
            codec.encode(event)
        with pytest.raises(CodecError):
            fallback.encode(event)
    for edge in (2**63 - 1, -(2**63)):  # the widest longs are still written, as fastavro does
        assert _writer.write_long(edge) == _fastavro("long", edge)
    for flag in (None, True, False):
        event = _unchecked(intent, repeatable=flag)
        assert codec.encode(event)[10:] == _fastavro_event(codec, event)


def test_a_body_of_a_subclass_of_an_event_model_is_written_as_its_model() -> None:
    """fastavro wrote a body by its type tag, so a subclass of a body model (which an event
    holds: pydantic keeps a subclass instance as given) was written as its model; the
    compiled writer picked the branch by exact class and refused it."""

    class MyOutcome(ev.StepOutcome):
        pass

    codec = Codec()
    event = next(e for e in sample_events() if e.type == "step_outcome")
    mine = ev.Event(**{**event.__dict__, "body": MyOutcome(**event.body.__dict__)})
    assert type(mine.body) is MyOutcome
    assert codec.encode(mine) == codec.encode(event)
    assert codec.encode(mine)[10:] == _fastavro_event(codec, mine)
    with pytest.raises(CodecError):  # a class that is no branch's is still refused
        stranger = SimpleNamespace(**event.body.__dict__)
        codec.encode(ev.trusted(ev.Event, {**event.__dict__, "body": stranger}))


def test_a_time_in_a_zone_with_a_sub_millisecond_offset_is_written_as_fastavro_floors_it() -> None:
    """Whole milliseconds on the clock are not a whole-millisecond instant when the zone's
    offset has microseconds (Python allows it): rounding the float timestamp wrote the
    next millisecond where fastavro floors; a zone with no offset at all is naive."""
    millis = {"type": "long", "logicalType": "timestamp-millis"}
    for offset in (timedelta(microseconds=500), timedelta(hours=-5, microseconds=999)):
        at = datetime(2026, 3, 1, 12, 0, 0, 388000, tzinfo=timezone(offset))
        assert _writer.write_millis(at) == _fastavro(millis, at), offset

    class Floating(tzinfo):
        def utcoffset(self, dt: datetime | None) -> None:
            return None

        def dst(self, dt: datetime | None) -> None:
            return None

        def tzname(self, dt: datetime | None) -> str:
            return "floating"

    with pytest.raises(TypeError):
        _writer.write_millis(datetime(2026, 3, 1, tzinfo=Floating()))


@pytest.mark.parametrize(
    ("branch", "values"),
    [
        ("int", [0, -1, 2**31 - 1, -(2**31), 2**31, True, "1", 1.0]),
        ("long", [0, 2**63 - 1, -(2**63), True, "1", 1.0]),
        (
            {"type": "long", "logicalType": "timestamp-millis"},
            [datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), 1_700_000_000_000, True],
        ),
    ],
    ids=["int", "long", "timestamp-millis"],
)
def test_a_nullable_branch_fastavro_checks_is_written_and_refused_as_fastavro_does(
    branch: Any, values: list[Any]
) -> None:
    """The packaged schema has no [null, int/long/time] field yet; an additive version may
    (a new field with a null default): its writers must agree with fastavro already."""
    checked = _writer._HELPERS[_writer._strict_branch(branch) or ""]
    schema = fastavro.parse_schema(
        {"type": "record", "name": "R", "fields": [{"name": "f", "type": ["null", branch]}]}
    )
    for value in values:
        buf = io.BytesIO()
        try:
            fastavro.schemaless_writer(buf, schema, {"f": value})
        except (ValueError, TypeError, OverflowError):
            with pytest.raises((ValueError, TypeError, OverflowError)):
                checked(value)
            continue
        assert b"\x02" + checked(value) == buf.getvalue(), value

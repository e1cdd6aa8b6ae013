"""An event's JSON written straight from its Avro bytes is the JSON its model writes.

The recovery daemon's checkpoints store each tracked step's events as the lines
``Event.model_dump_json`` writes, now written from the Avro values it keeps without building
models (``Codec.to_json``).  Every event type, every character a string may hold and the
edges of time are written both ways and compared; a value cut short or changed is written
the fast way only when it says exactly what the models say of it; a schema that does not
mirror the models leaves every value to them.
"""

from __future__ import annotations

import copy
import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import pytest

from stepledger._avro_json import compile_json
from stepledger.codec import _BODY_BY_NAME, Codec, RegistryFraming
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.errors import CodecError, EventValidationError
from tests.unit.test_codec_reader import cut_or_changed, events


def fast(codec: Codec) -> Any:
    write = compile_json(codec.schema, _BODY_BY_NAME)
    assert write is not None
    return write


def intent(**changes: Any) -> ev.Event:
    """The step_intended event of the shared list, with ``changes``."""
    event = events()[4]
    assert isinstance(event.body, ev.StepIntended)
    return event.model_copy(update=changes)


def test_every_event_type_is_written_as_its_model_writes_it() -> None:
    codec = Codec()
    write = fast(codec)
    for event in events():
        data = codec.encode(event)
        line = write(data, len(codec.prefix))
        assert line is not None, event.type
        assert line == event.model_dump_json()
        assert ev.Event.model_validate_json(line) == event
        assert codec.to_json(data) == line


def test_every_character_a_string_holds_is_escaped_as_pydantic_escapes_it() -> None:
    codec = Codec()
    write = fast(codec)
    text = "".join(chr(c) for c in range(0x800)) + '"\\/\u2028\u2029\ufeff\U0001f600\U0010ffff'
    body = ev.AnomalyObserved(kind=text, detail=text[::-1], source=Source.HUMAN)
    event = events()[0].model_copy(update={"body": body, "step_id": text, "event_id": text})
    assert write(codec.encode(event), 10) == event.model_dump_json()


@pytest.mark.parametrize(
    "at",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, 0, 1000, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(2028, 2, 29, 0, 0, 0, 10000, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    ],
)
def test_times_are_written_as_pydantic_writes_them(at: datetime) -> None:
    codec = Codec()
    event = intent(occurred_at=at)
    event = event.model_copy(update={"body": event.body.model_copy(update={"deadline": at})})
    line = fast(codec)(codec.encode(event), 10)
    assert line == event.model_dump_json()
    assert ev.Event.model_validate_json(line) == event


def test_every_millisecond_of_a_day_and_days_across_the_range_are_written_alike() -> None:
    codec = Codec()
    write = fast(codec)
    base = datetime(2024, 2, 28, tzinfo=UTC)
    step = timedelta(days=1, hours=7, minutes=13, seconds=17, milliseconds=389)
    for at in [base + timedelta(milliseconds=ms) for ms in range(0, 86_400_000, 86_399)] + [
        datetime(1, 1, 1, tzinfo=UTC) + step * n for n in range(0, 2_800_000, 9_973)
    ]:
        event = intent(occurred_at=at)
        assert write(codec.encode(event), 10) == event.model_dump_json(), at


def test_a_time_past_what_datetime_holds_is_left_to_the_decoder() -> None:
    codec = Codec()
    record = fastavro.schemaless_reader(
        io.BytesIO(codec.encode(intent())[10:]), codec.schema, None, return_record_name=True
    )
    assert isinstance(record, dict)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.schema, {**record, "occurred_at": 253402300800000})
    data = codec.prefix + buf.getvalue()
    assert fast(codec)(data, 10) is None
    with pytest.raises(CodecError):
        codec.to_json(data)


def test_cut_or_changed_bytes_are_written_as_the_models_write_them_or_left_to_them() -> None:
    codec = Codec()
    write = fast(codec)
    written = declined = 0
    for event in events():
        for variant in cut_or_changed(codec.encode(event)):
            line = write(variant, 10)
            if line is None:
                declined += 1
                continue
            written += 1
            try:
                decoded = codec.decode(variant)
            except (CodecError, EventValidationError):
                # The writer does not check the models' rules (it writes values the daemon
                # decoded before); a line it writes for one they refuse is refused on load.
                with pytest.raises(ValueError):
                    ev.Event.model_validate_json(line)
                continue
            assert line == decoded.model_dump_json()
    assert written > 100 and declined > 1000, (written, declined)


def test_a_schema_that_does_not_mirror_the_models_leaves_its_values_to_them() -> None:
    codec = Codec()
    schema = copy.deepcopy(codec.schema)
    named = schema["__named_schemas"]
    anomaly = named["stepledger.AnomalyObserved"]
    anomaly["fields"] = list(reversed(anomaly["fields"]))  # same names, another order
    write = compile_json(schema, _BODY_BY_NAME)
    assert write is not None
    buf = io.BytesIO()
    record = {"kind": "k", "detail": "d", "source": "human"}
    envelope = {
        "event_id": "e",
        "workflow_id": "wf",
        "step_id": None,
        "fleet_id": "f",
        "producer_id": "p",
        "occurred_at": 0,
        "body": ("stepledger.AnomalyObserved", record),
    }
    fastavro.schemaless_writer(buf, schema, envelope)
    assert write(codec.prefix + buf.getvalue(), 10) is None
    # The other bodies keep the fast path.
    assert write(codec.encode(intent()), 10) == intent().model_dump_json()
    schema["fields"] = list(reversed(schema["fields"]))
    assert compile_json(schema, _BODY_BY_NAME) is None


def test_an_empty_short_or_unframed_value_is_refused_as_decode_refuses_it() -> None:
    codec = Codec()
    data = codec.encode(intent())
    for value in (b"", data[:4], data[:10], b"\x00\x00" + data[2:], data[:9] + b"\x00" + data[10:]):
        with pytest.raises(CodecError):
            codec.to_json(value)


def test_to_json_writes_a_registry_framed_value_and_decodes_another_framing() -> None:
    codec = Codec(registry=RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value"))
    event = intent()
    assert codec.to_json(codec.encode(event)) == event.model_dump_json()
    # A value in the other framing is not the codec's own: decoded, then dumped.
    assert codec.to_json(Codec().encode(event)) == event.model_dump_json()

"""The compiled reader gives what fastavro and the models give, or declines and lets them decide.

Every event type is read both ways; so are values fastavro can write but the models refuse
(out of range, empty, naive times) and values cut short or with any byte changed.  Whenever
the compiled reader returns an event, the standard path must return an equal one; whenever
the standard path refuses a value, the compiled reader must have declined it.
"""

from __future__ import annotations

import io
import uuid
from typing import Any

import fastavro
import pytest

from stepledger._avro_read import compile_reader
from stepledger.codec import _BODY_BY_NAME, Codec, RegistryFraming, from_record
from stepledger.domain import events as ev
from stepledger.errors import CodecError, EventValidationError
from tests.unit.test_codec_fastpath import AT, BODIES, assert_same, mutations


def events() -> list[ev.Event]:
    """One event of each body type, with and without a step id."""
    return [
        ev.Event(
            event_id=f"e{i}",
            workflow_id="wf",
            step_id="s1" if i % 2 else None,
            fleet_id="f",
            producer_id="p",
            occurred_at=AT,
            body=body,  # type: ignore[arg-type]
        )
        for i, body in enumerate(BODIES)
    ]


def standard(codec: Codec, data: bytes) -> ev.Event:
    """What the codec gave before the compiled reader: fastavro, then the models."""
    try:
        record = fastavro.schemaless_reader(
            io.BytesIO(data[10:]), codec.schema, None, return_record_name=True
        )
    except Exception as exc:
        raise CodecError(f"undecodable: {exc}") from exc
    assert isinstance(record, dict)
    return from_record(record)


def cut_or_changed(data: bytes) -> list[bytes]:
    """A framed value cut short at every byte of its body, one byte longer, and with each
    body byte replaced by a few telling values."""
    variants = [data[:end] for end in range(10, len(data))]
    variants += [data + b"\x00"]
    for at in range(10, len(data)):
        for byte in (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, data[at] ^ 0x01):
            variants.append(data[:at] + bytes([byte]) + data[at + 1 :])
    return variants


def compiled(codec: Codec) -> Any:
    reader = compile_reader(codec.schema, _BODY_BY_NAME)
    assert reader is not None
    return reader


def test_every_event_type_is_read_by_the_compiled_reader_as_the_models_build_it() -> None:
    codec = Codec()
    read = compiled(codec)
    for event in events():
        data = codec.encode(event)
        fast = read(data, 10)
        assert fast is not None, event.type
        assert_same(fast, standard(codec, data))
        assert fast == event


def test_decode_takes_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # fastavro is the fallback only: a valid value of the codec's own schema never needs it.
    codec = Codec()
    values = [codec.encode(event) for event in events()]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("fastavro was asked to read a value of the codec's own schema")

    monkeypatch.setattr(fastavro, "schemaless_reader", refuse)
    assert [codec.decode(value) for value in values] == events()


def test_a_registry_framed_value_takes_the_compiled_path_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codec = Codec(registry=RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value"))
    value = codec.encode(events()[4])
    monkeypatch.setattr(fastavro, "schemaless_reader", None)
    assert codec.decode(value) == events()[4]


def written(codec: Codec, record: dict[str, Any]) -> bytes | None:
    """A record as fastavro writes it (framed), or None if fastavro cannot write it."""
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, codec.schema, record)
    except Exception:
        return None
    return codec.encode(events()[0])[:10] + buf.getvalue()


def test_values_the_models_refuse_are_left_to_them() -> None:
    codec = Codec()
    read = compiled(codec)
    built = refused = 0
    for event in events():
        original = fastavro.schemaless_reader(
            io.BytesIO(codec.encode(event)[10:]), codec.schema, None, return_record_name=True
        )
        assert isinstance(original, dict)
        for record in mutations(original):
            data = written(codec, record)
            if data is None:
                continue
            fast = read(data, 10)
            try:
                slow = standard(codec, data)
            except (CodecError, EventValidationError):
                assert fast is None, record
                refused += 1
                continue
            if fast is not None:
                assert_same(fast, slow)
                built += 1
    # Both outcomes must have been exercised many times for the comparison to mean anything.
    assert built > 200 and refused > 100, (built, refused)


def test_cut_or_changed_bytes_are_read_as_fastavro_reads_them_or_left_to_it() -> None:
    codec = Codec()
    read = compiled(codec)
    built = declined = 0
    for event in events():
        for variant in cut_or_changed(codec.encode(event)):
            fast = read(variant, 10)
            if fast is None:
                declined += 1
                continue
            assert_same(fast, standard(codec, variant))
            built += 1
    assert built > 100 and declined > 1000, (built, declined)


def test_a_model_invalid_event_is_still_refused_and_named() -> None:
    codec = Codec()
    record = fastavro.schemaless_reader(
        io.BytesIO(codec.encode(events()[4])[10:]), codec.schema, None, return_record_name=True
    )
    assert isinstance(record, dict)
    name, body = record["body"]
    data = written(codec, {**record, "body": (name, {**body, "attempt": 0})})
    assert data is not None
    assert compiled(codec)(data, 10) is None
    with pytest.raises(EventValidationError, match="attempt"):
        codec.decode(data)

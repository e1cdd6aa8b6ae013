"""The compiled reader gives what fastavro and the models give, or declines and lets them decide.

Every event type is read both ways; so are values fastavro can write but the models refuse
(out of range, empty, naive times) and values cut short or with any byte changed.  Whenever
the compiled reader returns an event, the standard path must return an equal one; whenever
the standard path refuses a value, the compiled reader must have declined it.
"""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import fastavro
import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stepledger.codec import Codec, RegistryFraming, from_record
from stepledger.codec.checks import checks_for
from stepledger.codec.core import _BODY_BY_NAME
from stepledger.codec.reader import compile_reader
from stepledger.domain import events as ev
from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
    WorkflowStatus,
)
from stepledger.errors import CodecError, EventValidationError

AT = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
BODIES: list[BaseModel] = [
    ev.WorkflowStarted(name="n", attempt=1, read_only=False, max_attempts=3),
    ev.WorkflowResumed(attempt=2, reason="crash"),
    ev.WorkflowFinished(status=WorkflowStatus.COMPLETED, detail="d", escalation_id="e"),
    ev.WorkflowDeadLettered(attempt=6, reason="r", escalation_id="e"),
    ev.StepIntended(
        sequence=0,
        tool="pay",
        effect=EffectClass.IDEMPOTENT,
        policy=ResolutionPolicy.QUERY,
        idempotency_key="k",
        arguments_json="{}",
        arguments_digest="d",
        deadline=AT,
        attempt=1,
        repeatable=True,
    ),
    ev.StepOutcome(status=OutcomeStatus.SUCCEEDED, result_json="{}", source=Source.AGENT),
    ev.CompensationIntended(idempotency_key="k:c", reason="r", source=Source.AGENT, deadline=AT),
    ev.CompensationOutcome(status=CompensationStatus.FAILED, error="x", source=Source.AGENT),
    ev.StepAbandoned(reason="r", escalation_id="e", source=Source.RECOVERY),
    ev.ResolutionAttempted(policy=ResolutionPolicy.REDRIVE, attempt=2),
    ev.EscalationResolved(escalation_id="e", verdict=Verdict.HAPPENED, by="ann"),
    ev.ApprovalRequested(tool="pay"),
    ev.ApprovalDecided(granted=True, by="ann"),
    ev.AnomalyObserved(kind="k", detail="d", source=Source.RECONCILE),
]
PLUS_TWO = timezone(timedelta(hours=2))
HOSTILE: list[Any] = [
    "",
    "x",
    None,
    0,
    -1,
    1,
    2.0,
    True,
    False,
    b"x",
    ev.INT32_MIN - 1,
    ev.INT32_MIN,
    ev.INT32_MAX,
    ev.INT32_MAX + 1,
    ev.INT64_MIN - 1,
    ev.INT64_MAX,
    ev.INT64_MAX + 1,
    "nope",
    "succeeded",
    "agent",
    "query",
    "idempotent",
    AT,
    AT.replace(tzinfo=None),
    AT.replace(microsecond=123456),
    AT.astimezone(PLUS_TWO),
    datetime(1, 1, 1, tzinfo=UTC),
    {"nested": 1},
]


def assert_same(fast: ev.Event, slow: ev.Event) -> None:
    assert type(fast.body) is type(slow.body)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert list(fast.__dict__) == list(slow.__dict__)
    assert list(fast.body.__dict__) == list(slow.body.__dict__)
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.body.model_fields_set == slow.body.model_fields_set
    assert fast.__pydantic_extra__ is None and fast.__pydantic_private__ is None
    assert hash(fast.event_id) == hash(slow.event_id)


def mutations(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record with each envelope and body field replaced, dropped, or a key added."""
    name, body = record["body"]
    out = []
    for key in [k for k in record if k != "body"]:
        for value in HOSTILE:
            out.append({**record, key: value})
        out.append({k: v for k, v in record.items() if k != key})
    for key in body:
        for value in HOSTILE:
            out.append({**record, "body": (name, {**body, key: value})})
        out.append({**record, "body": (name, {k: v for k, v in body.items() if k != key})})
    out.append({**record, "extra": 1})
    out.append({**record, "body": (name, {**body, "extra": 1})})
    return out


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


class _Pattern(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    code: str = Field(pattern="^[a-z]+$")


class _Validated(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int

    @model_validator(mode="after")
    def _check(self) -> _Validated:
        return self


class _Loose(BaseModel):
    model_config = ConfigDict(frozen=True)
    n: int


class _Float(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    x: float


@pytest.mark.parametrize("model", [_Pattern, _Validated, _Loose, _Float])
def test_a_model_outside_the_checks_gets_none(model: type[BaseModel]) -> None:
    # A constraint, validator, setting or type the checks do not know leaves it to pydantic.
    assert checks_for(model) is None


def test_read_events_share_their_fields_set_but_a_copy_changes_its_own() -> None:
    # Every event the reader builds shares one fields set per model: pydantic copies it
    # before a copy changes it, so no change to one event reaches another.
    codec = Codec()
    read = compiled(codec)
    first, second = (read(codec.encode(event), 10) for event in events()[4:6])
    assert first is not None and second is not None
    copied = first.model_copy(update={"step_id": "other"})
    assert copied.step_id == "other" and copied.model_fields_set is not first.model_fields_set
    assert first.model_fields_set == second.model_fields_set == set(ev.Event.model_fields)
    assert first.model_fields_set is second.model_fields_set

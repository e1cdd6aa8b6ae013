"""Codec round trips in both framings, corrupt input, values it must refuse to write, JSON
lines from values, and an additively evolved reader: each with the compiled reader and
without it (``Codec(compiled=False)``)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import fastavro
import pytest

from stepledger.codec import Codec, RegistryFraming, from_record, load_envelope_schema, to_record
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source, WorkflowStatus
from stepledger.errors import CodecError, EventValidationError, UnknownSchemaError
from tests.unit.factories import factory, pay_tool


@pytest.fixture(autouse=True, params=[True, False], ids=["compiled", "fastavro"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every ``Codec()`` of a test reads with the compiled reader, then without it."""
    defaults = Codec.__init__.__kwdefaults__
    assert defaults is not None and "compiled" in defaults
    monkeypatch.setitem(defaults, "compiled", request.param)
    return bool(request.param)


def sample_events() -> list[ev.Event]:
    f = factory()
    intent = f.intent("wf", "s1", pay_tool(), {"amount": 3}, sequence=0)
    return [
        f.workflow_started("wf", name="n", attempt=1, read_only=False, max_attempts=3),
        intent,
        f.outcome("wf", "s1", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"id": 1}),
        f.outcome(
            "wf",
            "s1",
            attempt=1,
            status=OutcomeStatus.FAILED,
            error=ValueError("x"),
            source=Source.RECOVERY_QUERY,
            evidence={"probe": "not_found"},
        ),
        f.envelope("wf", "s1", ev.ApprovalDecided(granted=True, by="ann")),
        f.envelope("wf", None, ev.WorkflowDeadLettered(attempt=6, reason="r", escalation_id="e")),
    ]


@pytest.mark.parametrize("registry", [False, True], ids=["single-object", "registry"])
def test_round_trip(registry: bool) -> None:
    framing = RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value") if registry else None
    codec = Codec(registry=framing)
    for event in sample_events():
        data = codec.encode(event)
        assert data[:1] == (b"\x00" if registry else b"\xc3")
        assert codec.decode(data) == event


def test_reader_accepts_both_framings() -> None:
    registry_codec = Codec(registry=RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value"))
    plain = Codec().encode(sample_events()[1])
    assert registry_codec.decode(plain) == sample_events()[1]


@pytest.mark.parametrize(
    "data,error",
    [
        (b"", CodecError),
        (b"garbage-bytes", CodecError),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", UnknownSchemaError),
        (b"\x00\x00\x00\x00\x07body", UnknownSchemaError),
    ],
)
def test_corrupt_values_raise_our_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        Codec().decode(data)


def test_truncated_body_is_a_codec_error() -> None:
    data = Codec().encode(sample_events()[1])
    with pytest.raises(CodecError):
        Codec().decode(data[:-20])


def test_model_invalid_event_is_a_validation_error() -> None:
    codec = Codec()
    record = to_record(sample_events()[0])
    record["body"][1]["attempt"] = 0  # the model requires attempt >= 1
    import io

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.schema, record)
    data = codec.encode(sample_events()[0])[:10] + buf.getvalue()
    with pytest.raises(EventValidationError):
        codec.decode(data)


def older_schema() -> dict[str, Any]:
    """The contract as it was before StepIntended gained requires_approval (additive change)."""
    schema = copy.deepcopy(dict(load_envelope_schema()))
    schema.pop("__fastavro_parsed", None)
    body = next(f for f in schema["fields"] if f["name"] == "body")
    for branch in body["type"]:
        if isinstance(branch, dict) and branch["name"].endswith("StepIntended"):
            branch["fields"] = [f for f in branch["fields"] if f["name"] != "requires_approval"]
    parsed = fastavro.parse_schema(schema)
    assert isinstance(parsed, dict)
    return dict(parsed)


@pytest.mark.parametrize("registry", [False, True], ids=["single-object", "registry"])
def test_evolved_reader_reads_older_writer(registry: bool) -> None:
    old = older_schema()
    # One client: the mock registry keeps its schemas per client instance.
    shared = RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value") if registry else None
    writer = Codec(old, registry=shared)
    reader = Codec(registry=shared, known_writer_schemas=[] if registry else [old])
    event = sample_events()[1]
    decoded = reader.decode(writer.encode(event))
    assert decoded == event
    assert isinstance(decoded.body, ev.StepIntended)
    assert decoded.body.requires_approval is False  # filled from the reader's default


def test_unknown_older_writer_is_refused_without_its_schema() -> None:
    writer = Codec(older_schema())
    with pytest.raises(UnknownSchemaError):
        Codec().decode(writer.encode(sample_events()[1]))


def test_the_0_2_0_fields_round_trip() -> None:
    f = factory()
    finished = ev.WorkflowFinished(
        status=WorkflowStatus.COMPENSATION_INCOMPLETE,
        detail="left standing: email",
        escalation_id="esc-1",
        left_standing_json='[{"step_id":"email"}]',
    )
    events = [
        f.intent("wf", "s2", pay_tool(), {"amount": 3}, sequence=1, after_pivot=True),
        f.envelope("wf", None, finished),
    ]
    codec = Codec()
    for event in events:
        assert codec.decode(codec.encode(event)) == event
    body = events[0].body
    assert isinstance(body, ev.StepIntended) and body.after_pivot and body.repeatable


def test_the_registrys_errors_are_the_codecs_own() -> None:
    framing = RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value")
    with pytest.raises(UnknownSchemaError, match="schema id 4242 not in registry"):
        framing.writer_schema(4242)
    with pytest.raises(CodecError, match="schema registry refused the schema"):
        framing.register({"type": "record", "name": "Bad", "fields": [{"name": "x"}]})


def _unchecked(event: ev.Event, **body: Any) -> ev.Event:
    """``event`` with body values no validation saw (as ``trusted`` builds them)."""
    changed = ev.trusted(type(event.body), {**event.body.__dict__, **body})
    return ev.trusted(ev.Event, {**event.__dict__, "body": changed})


def test_a_value_of_the_wrong_kind_is_a_codec_error_not_bytes() -> None:
    codec = Codec()
    intent = sample_events()[1]
    wrong = [
        intent.model_copy(update={"workflow_id": 7}),
        intent.model_copy(update={"body": intent.body.model_copy(update={"effect": "nope"})}),
        *(
            _unchecked(intent, **values)
            for values in ({"sequence": 2**63}, {"epoch": -(2**63) - 1}, {"deadline": 2**64})
        ),
    ]
    for event in wrong:
        with pytest.raises(CodecError, match="cannot encode"):
            codec.encode(event)


def test_from_record_names_the_invalid_field() -> None:
    record = to_record(sample_events()[1])
    name, body = record["body"]
    with pytest.raises(EventValidationError, match="attempt"):
        from_record({**record, "body": (name, {**body, "attempt": 0})})
    assert from_record(record) == sample_events()[1]


@pytest.mark.parametrize("registry", [False, True], ids=["single-object", "registry"])
def test_to_json_is_the_models_json_and_refuses_what_decode_refuses(registry: bool) -> None:
    framing = RegistryFraming(f"mock://{uuid.uuid4().hex}", "t-value") if registry else None
    codec = Codec(registry=framing)
    for event in sample_events():
        line = codec.to_json(codec.encode(event))
        assert line == codec.decode(codec.encode(event)).model_dump_json()
        assert ev.Event.model_validate_json(line) == event
    data = codec.encode(sample_events()[1])
    for value in (b"", data[:4], data[: len(codec.prefix)], b"\x01\x00" + data[2:]):
        with pytest.raises(CodecError):
            codec.to_json(value)


def test_the_switch_chooses_the_path(reader: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = Codec()
    data = codec.encode(sample_events()[1])
    read = fastavro.schemaless_reader
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return read(*args, **kwargs)

    monkeypatch.setattr(fastavro, "schemaless_reader", counted)
    assert codec.decode(data) == sample_events()[1]
    assert calls == ([] if reader else [1])

"""The pydantic models and schemas/*.avsc cannot drift apart."""

from __future__ import annotations

import json
import types
import typing
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

from stepledger.codec import schema_dir
from stepledger.domain import enums
from stepledger.domain.events import (
    BODY_TYPES,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Event,
)

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
AVRO_PRIMITIVE = {str: "string", int: "int", bool: "boolean", float: "double"}
AVRO_RANGE = {"int": (INT32_MIN, INT32_MAX), "long": (INT64_MIN, INT64_MAX)}


def avsc(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"stepledger.{name}.avsc").read_text()))


def expected_avro_type(annotation: Any) -> tuple[Any, bool]:
    """The Avro type a model annotation must have, and whether it is optional."""
    if get_origin(annotation) is typing.Annotated:
        return expected_avro_type(get_args(annotation)[0])
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return expected_avro_type(args[0])[0], True
    if annotation is datetime:
        return {"type": "long", "logicalType": "timestamp-millis"}, False
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return f"stepledger.{annotation.__name__}", False
    return AVRO_PRIMITIVE[annotation], False


def avro_field_type(field: dict[str, Any]) -> tuple[Any, bool]:
    kind = field["type"]
    if isinstance(kind, list) and kind[0] == "null" and len(kind) == 2:
        return kind[1], True
    return kind, False


def test_schema_files_are_named_by_full_name() -> None:
    for path in SCHEMAS.glob("*.avsc"):
        schema = json.loads(path.read_text())
        assert path.name == f"{schema['namespace']}.{schema['name']}.avsc"


def test_packaged_schemas_are_the_contract() -> None:
    assert sorted(p.name for p in schema_dir().glob("*.avsc")) == sorted(
        p.name for p in SCHEMAS.glob("*.avsc")
    )


@pytest.mark.parametrize("model", BODY_TYPES, ids=lambda m: m.__name__)
def test_body_model_matches_its_schema(model: type[BaseModel]) -> None:
    check_record(model, avsc(model.__name__), skip={"type"})


def test_envelope_matches_its_schema() -> None:
    schema = avsc("Event")
    check_record(Event, schema, skip={"body"})
    body = next(f for f in schema["fields"] if f["name"] == "body")
    assert body["type"] == [f"stepledger.{m.__name__}" for m in BODY_TYPES]
    tags: list[object] = [m.model_fields["type"].annotation for m in BODY_TYPES]
    assert all(get_origin(t) is Literal for t in tags)


def check_record(model: type[BaseModel], schema: dict[str, Any], skip: set[str]) -> None:
    fields = {f["name"]: f for f in schema["fields"]}
    model_fields = {k: v for k, v in model.model_fields.items() if k not in skip}
    assert set(model_fields) == set(fields) - skip, f"{model.__name__} field names differ"
    for name, info in model_fields.items():
        want, want_optional = expected_avro_type(info.annotation)
        got, got_optional = avro_field_type(fields[name])
        if want == "int" and _bounds(model, name)[1] > INT32_MAX:
            want = "long"  # an AvroLong field
        assert got == want, f"{model.__name__}.{name}: model {want}, schema {got}"
        assert got_optional == want_optional, f"{model.__name__}.{name}: optionality differs"
        if isinstance(got, str) and got in AVRO_RANGE:
            check_bounds(model, name, *AVRO_RANGE[got])
        has_default = not info.is_required()
        assert ("default" in fields[name]) == has_default, f"{model.__name__}.{name}: default"
        if has_default and not isinstance(info.default, datetime):
            assert fields[name]["default"] == _plain(info.default), f"{name}: default value"


def check_bounds(model: type[BaseModel], name: str, low: int, high: int) -> None:
    """An integer field refuses what its Avro type cannot hold (fastavro would write it)."""
    minimum, maximum = _bounds(model, name)
    assert low <= minimum and maximum <= high, f"{model.__name__}.{name}: bounds"


def _bounds(model: type[BaseModel], name: str) -> tuple[int, int]:
    """An integer field's (minimum, maximum) in the model's JSON schema (optional or not)."""
    prop = model.model_json_schema()["properties"][name]
    found = next((p for p in prop.get("anyOf", [prop]) if p.get("type") == "integer"), prop)
    if "minimum" not in found or "maximum" not in found:
        return INT64_MIN - 1, INT64_MAX + 1  # no bounds: refused by any range check
    return found["minimum"], found["maximum"]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, StrEnum) else value


@pytest.mark.parametrize(
    "enum", [getattr(enums, n) for n in dir(enums) if n[0].isupper() and n != "StrEnum"]
)
def test_enum_symbols_match(enum: type[StrEnum]) -> None:
    assert avsc(enum.__name__)["symbols"] == [m.value for m in enum]

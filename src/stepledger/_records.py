"""Event models from decoded Avro records, without pydantic's validation when it cannot matter.

fastavro hands the codec values already shaped by the schema: strings are ``str``, booleans
``bool``, integers ``int``, timestamps aware UTC datetimes.  What pydantic still decides is
each model's own constraints: integer ranges, non-empty ids, enum symbols, whole
milliseconds, no missing or extra field.  A plan derived from every model's fields checks
exactly those, and a record that passes is built as ``model_validate`` builds it (the same
field values, the same fields set).  Anything else (a record failing a check, or a model
with a field, validator or setting the plan does not know) returns None, and the caller
asks pydantic, which gives the verdict and the reason.  A test compares both paths.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from types import NoneType, UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin

from annotated_types import Ge, Le, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stepledger.domain import events as ev

#: A field's check as a Python expression over ``v`` that is true when pydantic would keep
#: the value unchanged, and the expression giving the model's value (``v`` or a lookup).
Check = tuple[str, str]

_STR = "type(v) is str"


def _check_enum(name: str, enum: type[Enum], names: dict[str, Any]) -> Check:
    names[f"_members_{name}"] = {member.value: member for member in enum}
    return f"type(v) is str and v in _members_{name}", f"_members_{name}[v]"


#: ev._utc_millis returns an equal datetime for exactly these values.
_UTC_MILLIS = "type(v) is _datetime and v.tzinfo is _UTC and not v.microsecond % 1000"


def _bounds(metadata: list[Any]) -> tuple[int, int] | None:
    low, high = ev.INT64_MIN, ev.INT64_MAX
    for item in metadata:
        if isinstance(item, Ge):
            low = max(low, int(item.ge))  # type: ignore[call-overload]
        elif isinstance(item, Le):
            high = min(high, int(item.le))  # type: ignore[call-overload]
        else:
            return None
    return low, high


def _field_check(
    name: str, info: FieldInfo, validators: list[Any], names: dict[str, Any]
) -> Check | None:
    """The check of one field, or None when the plan does not know its kind."""
    annotation, metadata = info.annotation, list(info.metadata)
    if annotation is datetime and not metadata and validators == [ev._utc_millis]:
        return _UTC_MILLIS, "v"
    if validators:
        return None
    if annotation is str:
        if not metadata:
            return _STR, "v"
        if len(metadata) == 1 and isinstance(metadata[0], MinLen):
            return f"{_STR} and len(v) >= {int(metadata[0].min_length)}", "v"
        return None
    if annotation is int:
        bounds = _bounds(metadata)
        return (
            None if bounds is None else (f"type(v) is int and {bounds[0]} <= v <= {bounds[1]}", "v")
        )
    if metadata:
        return None
    if annotation is bool:
        return "type(v) is bool", "v"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _check_enum(name, annotation, names)
    if get_origin(annotation) in (Union, UnionType):
        args = set(get_args(annotation))
        if args in ({str, NoneType}, {bool, NoneType}):
            kind = (args - {NoneType}).pop().__name__
            return f"v is None or type(v) is {kind}", "v"
    return None


def _validators(model: type[BaseModel]) -> dict[str, list[Any]] | None:
    decorators = model.__pydantic_decorators__
    if any(
        (
            decorators.model_validators,
            decorators.root_validators,
            decorators.validators,
            decorators.field_serializers,
            decorators.model_serializers,
            decorators.computed_fields,
        )
    ):
        return None
    by_field: dict[str, list[Any]] = {}
    for decorator in decorators.field_validators.values():
        if decorator.info.mode != "after":
            return None
        for name in decorator.info.fields:
            by_field.setdefault(name, []).append(decorator.func)
    return by_field


#: Builds a model from a record (and the envelope's body), or returns None.
Builder = Callable[..., Any]

_new = object.__new__
# The slots model_validate fills besides the fields; their descriptors are set directly
# because the frozen models refuse setattr.
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _construct(model: type[BaseModel], values: dict[str, Any], fields: frozenset[str]) -> Any:
    """The model instance ``model_validate`` would return for values it accepted unchanged."""
    instance = _new(model)
    instance.__dict__.update(values)
    _set_fields_set(instance, set(fields))
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def _compile(
    model: type[BaseModel],
    checks: dict[str, Check],
    constants: dict[str, Any],
    names: dict[str, Any],
    extra: str | None,
) -> Builder:
    """One function checking every field inline: a call per field cost more than pydantic."""
    lines = [f"def build(record{', ' + extra if extra else ''}):"]
    values = [f"{name!r}: {value!r}" for name, value in constants.items()]
    for i, (name, (test, value)) in enumerate(checks.items()):
        lines += [f"    v = record[{name!r}]", f"    if not ({test}):", "        return None"]
        lines.append(f"    f{i} = {value}")
        values.append(f"{name!r}: f{i}")
    if extra:
        values.append(f"{extra!r}: {extra}")
    lines.append(f"    return _construct(_model, {{{', '.join(values)}}}, _fields)")
    scope = {
        **names,
        "_construct": _construct,
        "_model": model,
        "_fields": frozenset(model.model_fields),
        "_datetime": datetime,
        "_UTC": UTC,
    }
    exec("\n".join(lines), scope)
    return cast(Builder, scope["build"])


class Plan:
    """How to check and build one model from a decoded record."""

    __slots__ = ("build", "keys")

    def __init__(self, keys: frozenset[str], build: Builder) -> None:
        self.keys = keys
        """The record's keys: exactly these, no more (the models forbid extra fields)."""
        self.build = build
        """The model of a record with these keys, or None when a value fails its check."""


def plan_for(model: type[BaseModel], extra: str | None = None) -> Plan | None:
    """A plan for a model (``extra``: a field the caller builds), or None if it is outside it."""
    config = dict(model.model_config)
    if config != {"frozen": True, "extra": "forbid"} or model.__private_attributes__:
        return None
    validators = _validators(model)
    if validators is None:
        return None
    checks: dict[str, Check] = {}
    constants: dict[str, Any] = {}
    names: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name == extra:
            continue
        if get_origin(info.annotation) is Literal and info.default in get_args(info.annotation):
            constants[name] = info.default
            continue
        check = _field_check(name, info, validators.get(name, []), names)
        if check is None:
            return None
        checks[name] = check
    return Plan(frozenset(checks), _compile(model, checks, constants, names, extra))


class EventPlans:
    """Plans for the envelope and every body type, keyed by the body's Avro record name."""

    def __init__(self, bodies: dict[str, type[BaseModel]]) -> None:
        self.envelope = plan_for(ev.Event, extra="body")
        self.bodies = {name: plan_for(model) for name, model in bodies.items()}
        self._keys = None if self.envelope is None else self.envelope.keys | {"body"}

    def build(self, record: dict[str, Any]) -> ev.Event | None:
        """The event of a decoded record, or None when pydantic must decide."""
        envelope = self.envelope
        if envelope is None or record.keys() != self._keys:
            return None
        name, body = record["body"]
        plan = self.bodies.get(name)
        if plan is None or type(body) is not dict or body.keys() != plan.keys:
            return None
        built = plan.build(body)
        if built is None:
            return None
        return cast(ev.Event | None, envelope.build(record, built))

"""The checks pydantic makes on an event's fields, as data the compiled reader applies.

Avro hands over values already shaped by the schema: strings, booleans, integers,
timestamps.  What pydantic still decides is each model's own constraints: integer ranges,
non-empty ids, enum symbols, whole milliseconds, no missing or extra field.  The checks
derived here from every model's fields (:class:`Check`, :class:`ModelChecks`) say exactly
those, and :meth:`ModelChecks.construct` builds a model as ``model_validate`` builds it (the
same field values, the same fields set).  A model with a field, validator or setting they do
not know gets no checks (:func:`checks_for` returns None), and its values go to pydantic.
:mod:`stepledger.codec.reader` applies them to the values it reads straight from Avro bytes.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from enum import Enum
from types import NoneType, UnionType
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

from annotated_types import Ge, Le, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stepledger.domain import events as ev

#: The test of each kind of value a field takes, as a Python expression over ``v``.
TYPE_TESTS = {
    "str": "type(v) is str",
    "int": "type(v) is int",
    "bool": "type(v) is bool",
    "datetime": "type(v) is _datetime",
    "str|None": "v is None or type(v) is str",
    "bool|None": "v is None or type(v) is bool",
}


class Check(NamedTuple):
    """A field's check: true of a value exactly when pydantic would keep it unchanged."""

    kind: str
    """The Python types the field takes (a key of TYPE_TESTS)."""
    rest: str | None
    """What else a value of that kind must satisfy (an expression over ``v``), if anything."""
    value: str
    """The expression giving the model's value (``v`` or a lookup)."""

    @property
    def test(self) -> str:
        """The whole check as one expression over ``v``."""
        kind = TYPE_TESTS[self.kind]
        return kind if self.rest is None else f"{kind} and {self.rest}"


def _check_enum(name: str, enum: type[Enum], names: dict[str, Any]) -> Check:
    names[f"_members_{name}"] = {member.value: member for member in enum}
    return Check("str", f"v in _members_{name}", f"_members_{name}[v]")


#: ev._utc_millis returns an equal datetime for exactly these values.
UTC_MILLIS = Check("datetime", "v.tzinfo is _UTC and not v.microsecond % 1000", "v")


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
        return UTC_MILLIS
    if validators:
        return None
    if annotation is str:
        if not metadata:
            return Check("str", None, "v")
        if len(metadata) == 1 and isinstance(metadata[0], MinLen):
            return Check("str", f"len(v) >= {int(metadata[0].min_length)}", "v")
        return None
    if annotation is int:
        bounds = _bounds(metadata)
        return None if bounds is None else Check("int", f"{bounds[0]} <= v <= {bounds[1]}", "v")
    if metadata:
        return None
    if annotation is bool:
        return Check("bool", None, "v")
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _check_enum(name, annotation, names)
    if get_origin(annotation) in (Union, UnionType):
        args = set(get_args(annotation))
        if args in ({str, NoneType}, {bool, NoneType}):
            return Check(f"{(args - {NoneType}).pop().__name__}|None", None, "v")
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


_new = object.__new__
# The slots model_validate fills; their descriptors are set directly because the frozen
# models refuse setattr.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


@functools.cache
def _every_field(model: type[BaseModel]) -> set[str]:
    """The fields set of every instance built here: all the model's fields, one set a model.

    Shared rather than copied per instance (two sets were a third of a decoded event's
    memory, and the projector's time follows its memory): a frozen model never changes
    its set, and pydantic copies it before changing a copy's (``model_copy``).
    """
    return set(model.model_fields)


class ModelChecks:
    """What a model's plan checks: each field's check, the constant fields, the names used."""

    __slots__ = ("checks", "constants", "extra", "model", "names")

    def __init__(
        self,
        model: type[BaseModel],
        checks: dict[str, Check],
        constants: dict[str, Any],
        names: dict[str, Any],
        extra: str | None,
    ) -> None:
        self.model = model
        self.checks = checks
        """Each checked field's check, in the model's order."""
        self.constants = constants
        """Fields whose value is fixed (a body's ``type`` tag)."""
        self.names = names
        """What the checks' expressions refer to besides ``v``."""
        self.extra = extra
        """A field the caller builds and passes in (the envelope's body)."""

    def scope(self) -> dict[str, Any]:
        """The globals a function using these checks and :meth:`construct` runs with."""
        return {
            **self.names,
            "_new": _new,
            "_set_dict": _set_dict,
            "_set_fields_set": _set_fields_set,
            "_set_extra": _set_extra,
            "_set_private": _set_private,
            "_model": self.model,
            "_every_field": _every_field(self.model),
            "_datetime": datetime,
            "_UTC": UTC,
        }

    def construct(self, value_of: dict[str, str]) -> list[str]:
        """Lines building the model, as ``m``, from each checked field's local variable.

        The instance ``model_validate`` would return for values it accepted unchanged: the
        values (a new dict, in the model's field order) become its ``__dict__``, every field
        is set (:func:`_every_field`).  Inline: a call per model cost more than these lines.
        """
        values = [f"{name!r}: {value!r}" for name, value in self.constants.items()]
        values += [f"{name!r}: {value_of[name]}" for name in self.checks]
        if self.extra:
            values.append(f"{self.extra!r}: {self.extra}")
        return [
            "m = _new(_model)",
            f"_set_dict(m, {{{', '.join(values)}}})",
            "_set_fields_set(m, _every_field)",
            "_set_extra(m, None)",
            "_set_private(m, None)",
        ]


def checks_for(model: type[BaseModel], extra: str | None = None) -> ModelChecks | None:
    """What a plan for a model checks (``extra``: a field the caller builds), or None if the
    model is outside what a plan knows."""
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
    return ModelChecks(model, checks, constants, names, extra)

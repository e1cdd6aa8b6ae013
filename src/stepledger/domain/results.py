"""Results that come back as they went in: a replayed step returns what the first run returned.

A tool's result is recorded as JSON and returned from the log when the step is replayed.
:class:`ResultCodec` makes that lossless or loud, never a silent change of type:

- a tool that declares a result type (``Tool(result_type=...)`` or its function's return
  annotation) has its results dumped and validated by pydantic: JSON values, pydantic
  models, dataclasses, ``datetime``/``date``/``Decimal``/``UUID``/enums and containers of
  them come back equal and of the same type.  A type pydantic cannot handle is refused
  when the tool is defined (:func:`result_codec` raises);
- a tool that declares none must return plain JSON values (dict with string keys, list,
  str, int, float, bool, None); anything else (a tuple, a dataclass, a ``date``) would
  come back as something else, so it is refused when the outcome is recorded;
- every recorded result is checked by loading it back before it is written: a value that
  does not come back equal and of the same type (an ambiguous union, a custom ``__eq__``)
  is recorded as not replayable and both that run and a later replay raise
  :class:`~stepledger.errors.ResultTypeError`.

The outcome records which codec wrote the result (``result_type``: ``json``, the type's
qualified name, or ``!``-prefixed for a result that cannot be replayed); a replay whose
tool now declares another type raises instead of guessing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import TypeAdapter
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

from stepledger.errors import ResultTypeError, ToolDefinitionError

JSON = "json"
UNREPLAYABLE = "!"
#: Declared result types whose values JSON writes and reads back exactly, of the same type
#: (a finite float included): a result of exactly that type needs no pydantic round trip.
_EXACT = frozenset({str, int, bool, float})
#: Past this many bits an int may pass Python's 4,300-digit limit on int <-> str (JSON).
_INT_BITS = 14_000


def _kept_exactly(kind: type, value: Any) -> bool:
    """A str/int/bool/float JSON keeps exactly, known without the round trip.

    Not: a non-finite float, an int near the digit limit, a str that is not ASCII (a lone
    surrogate does not survive JSON); those take the round trip, which says why."""
    if kind is str:
        return bool(value.isascii())
    if kind is int:
        return bool(value.bit_length() <= _INT_BITS)
    return kind is bool or math.isfinite(value)


@dataclass(frozen=True)
class Encoded:
    """A result ready to record: its JSON-ready value and the name of the codec that wrote it."""

    value: Any
    result_type: str
    problem: str | None = None
    """Why the value would not come back as it went in (then it is recorded, not replayable)."""


class ResultCodec:
    """Turns one tool's results into JSON-ready values and back, losslessly or loudly."""

    def __init__(self, result_type: Any = None, *, tool: str = "") -> None:
        self.tool = tool
        self.declared = result_type
        self.name = JSON if result_type is None else type_name(result_type)
        self._adapter: TypeAdapter[Any] | None = None
        if result_type is not None:
            try:
                self._adapter = TypeAdapter(result_type)
                self._adapter.json_schema(mode="serialization")
            except (PydanticSchemaGenerationError, PydanticUserError, TypeError) as exc:
                raise ResultTypeError(
                    f"tool {tool!r}: results of type {self.name} cannot be recorded and "
                    f"replayed as they were ({_first_line(exc)}); return JSON values, a pydantic "
                    "model or a dataclass",
                    tool=tool,
                ) from None

    def encode(self, value: Any) -> Encoded:
        """The value as recorded; ``problem`` says why it would not replay as it is."""
        if value is None:
            return Encoded(None, self.name)
        kind = type(value)
        if kind is self.declared and kind in _EXACT and _kept_exactly(kind, value):
            return Encoded(value, self.name)  # JSON keeps it exactly: no round trip to prove
        if self._adapter is None:
            problem = json_problem(value)
            if problem is not None:
                return Encoded(_best_effort(value), UNREPLAYABLE + type_name(type(value)), problem)
            return Encoded(value, JSON)
        try:
            dumped = self._adapter.dump_python(value, mode="json")
            back = self._adapter.validate_json(json.dumps(dumped))
        except Exception as exc:
            problem = f"{type(value).__name__} is not a {self.name}: {_first_line(exc)}"
            return Encoded(_best_effort(value), UNREPLAYABLE + self.name, problem)
        if type(back) is not type(value) or back != value:
            problem = (
                f"{type(value).__name__} {value!r} would come back as "
                f"{type(back).__name__} {back!r}"
            )
            return Encoded(dumped, UNREPLAYABLE + self.name, problem)
        return Encoded(dumped, self.name)

    def decode(self, result_json: str | None, result_type: str | None) -> Any:
        """The recorded result as the first run returned it, or ResultTypeError."""
        if result_json is None:
            return None
        if result_type is not None and result_type.startswith(UNREPLAYABLE):
            raise ResultTypeError(
                f"tool {self.tool!r}: the recorded result ({result_type[1:]}) cannot be "
                "replayed as the first run returned it; declare a result type the SDK can "
                "round-trip (JSON values, a pydantic model, a dataclass)",
                tool=self.tool,
            )
        if result_type not in (None, self.name) and not (result_type == JSON and self.declared):
            raise ResultTypeError(
                f"tool {self.tool!r}: the result was recorded as {result_type}, the tool "
                f"now returns {self.name}",
                tool=self.tool,
            )
        raw = json.loads(result_json)
        if self._adapter is None:
            return raw
        try:
            return self._adapter.validate_python(raw)
        except Exception as exc:
            raise ResultTypeError(
                f"tool {self.tool!r}: the recorded result is not a {self.name}: {_first_line(exc)}",
                tool=self.tool,
            ) from None


def result_codec(result_type: Any, run: Callable[..., Any] | None, *, tool: str) -> ResultCodec:
    """The codec of a tool: its declared result type, else its run function's annotation."""
    if result_type is None and run is not None:
        try:
            result_type = return_annotation(run)
        except NameError as exc:
            raise ToolDefinitionError(
                f"tool {tool!r}: the return annotation of its function cannot be resolved "
                f"({exc}); pass result_type= explicitly",
                tool=tool,
            ) from None
    return ResultCodec(result_type, tool=tool)


def return_annotation(fn: Callable[..., Any]) -> Any:
    """A function's resolved return annotation; None when it has none (or it is Any/None).

    Raises NameError when the function has an annotation that names something not in reach
    (a class defined inside another function, under ``from __future__ import annotations``).
    """
    if "return" not in getattr(fn, "__annotations__", {}):
        return None
    hint = get_type_hints(fn).get("return")
    if hint is None or hint is type(None) or hint is Any or hint is object:
        return None
    return hint


def json_problem(value: Any) -> str | None:
    """Why a value would not come back from JSON as it is (None: it would)."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a JSON number"
    if isinstance(value, list):
        return next((p for p in map(json_problem, value) if p), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict with keys that are not strings"
        return next((p for p in map(json_problem, value.values()) if p), None)
    return f"a {type(value).__name__} comes back from JSON as something else"


def type_name(tp: Any) -> str:
    """A readable, stable name of a type (``module.Qualname`` or its repr for generics)."""
    if isinstance(tp, type):
        return f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp).replace("typing.", "")


def _best_effort(value: Any) -> Any:
    # Only so a human can read what happened; never returned by a replay.
    try:
        return json.loads(json.dumps(value, default=str))
    except ValueError:
        try:
            return repr(value)
        except ValueError:  # an int past Python's digit limit has no repr either
            return f"<{type(value).__name__} that has no text form>"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

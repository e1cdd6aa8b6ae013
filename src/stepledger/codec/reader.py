"""Events straight from the Avro bytes of the codec's own schema, checked as the models check.

fastavro reads a value one ``read(1)`` call per byte and hands back dicts that the codec
then checks and copies into models: two passes over every field.  For a value written
with the reader's own schema, the reader compiled here walks the bytes once, field by field
in the schema's order, applies each model field's check from :mod:`stepledger.codec.checks` as
soon as the field is read (dropping the type tests the Avro type already answers), and
builds the models in one pass (its A/B: docs/benchmarks.md, "Fast paths and their A/B").

It accepts a strict subset of what fastavro reads and gives exactly what fastavro and the
models give for it: canonical booleans, varints of at most 9 bytes, in-range union and
enum indexes, strings that fit the value and are UTF-8, the whole value consumed.  Anything
else (a short, corrupt or model-invalid value, a value past fastavro's C integers) gets
None, and the caller reads it the standard way, which accepts it or says why not.  A test
compares the two on every event type and on corrupted bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from stepledger.codec.checks import UTC_MILLIS, Check, ModelChecks, checks_for
from stepledger.domain import events as ev

#: Reads one event from a value and the offset of its Avro body; None: read it the standard way.
EventReader = Callable[[bytes, int], "ev.Event | None"]

Schema = Any
T = TypeVar("T")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: fastavro's C reader keeps a varint in 64 bits: past 9 bytes (63 bits) it would overflow.
_MAX_VARINT_BYTES = 9


class _Defer(Exception):
    """The value is outside the compiled reader's subset: the standard path decides."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of 2 to 9 bytes at ``pos`` (one byte is read inline), and the next pos."""
    n = shift = 0
    for b in buf[pos : pos + _MAX_VARINT_BYTES]:  # one slice: cheaper than indexing each byte
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
    raise _Defer  # longer than 9 bytes, or cut short


#: The value of a one-byte varint (a byte below 0x80); None for a byte that starts a longer one.
_ONE_BYTE = tuple((b >> 1) ^ -(b & 1) if b < 0x80 else None for b in range(256))
#: The length a one-byte varint gives a string; None for any other (longer, or negative).
_ONE_BYTE_LENGTH = tuple(b >> 1 if b < 0x80 and not b & 1 else None for b in range(256))

_COMMON = {
    "_ONE": _ONE_BYTE,
    "_LENGTH": _ONE_BYTE_LENGTH,
    "_varint": _varint,
    "_Defer": _Defer,
    "_EPOCH": _EPOCH,
    "_timedelta": timedelta,
    "_BOOL": (False, True),
}


class _Source:
    """Lines of one generated function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.scope: dict[str, Any] = dict(_COMMON)

    def add(self, indent: int, *lines: str) -> None:
        self.lines.extend("    " * indent + line for line in lines)

    def long(self, indent: int, target: str) -> None:
        # One byte holds most values (string lengths, indexes, small ints): a table lookup.
        self.add(
            indent,
            f"{target} = _ONE[buf[pos]]",
            f"if {target} is None:",
            f"    {target}, pos = _varint(buf, pos)",
            "else:",
            "    pos += 1",
        )

    def string(self, indent: int, target: str) -> None:
        self.add(
            indent,
            "n = _LENGTH[buf[pos]]",
            "if n is None:",
            "    n, pos = _varint(buf, pos)",
            "    if n < 0:",
            "        raise _Defer",
            "else:",
            "    pos += 1",
            "end = pos + n",
            "if end > size:",
            "    raise _Defer",
            f"{target} = buf[pos:end].decode()",
            "pos = end",
        )

    def compile(self, name: str) -> Callable[..., Any]:
        exec("\n".join(self.lines), self.scope)
        return cast(Callable[..., Any], self.scope[name])


def _named(schema: Schema, named: dict[str, Schema]) -> Schema:
    return named.get(schema, schema) if isinstance(schema, str) else schema


#: The Python types each kind of check admits (see ``checks.TYPE_TESTS``).
_ADMITS = {
    "str": {"str"},
    "int": {"int"},
    "bool": {"bool"},
    "datetime": {"datetime", "utc_millis"},
    "str|None": {"str", "None"},
    "bool|None": {"bool", "None"},
}


def _read_value(
    src: _Source, schema: Schema, named: dict[str, Schema], indent: int, target: str
) -> set[str] | None:
    """Lines reading one value into ``target``: the Python types it can be, None if the type
    is not handled."""
    schema = _named(schema, named)
    if isinstance(schema, list):
        return _read_union(src, schema, named, indent, target)
    kind = schema if isinstance(schema, str) else schema.get("type")
    logical = None if isinstance(schema, str) else schema.get("logicalType")
    if kind == "null":
        src.add(indent, f"{target} = None")
        return {"None"}
    if kind == "boolean":
        # fastavro reads any non-zero byte as True: only 0 and 1 are taken here.
        src.add(indent, f"{target} = _BOOL[buf[pos]]", "pos += 1")
        return {"bool"}
    if kind == "string" and logical is None:
        src.string(indent, target)
        return {"str"}
    if kind in ("int", "long") and logical is None:
        src.long(indent, target)
        return {"int"}
    if kind == "long" and logical == "timestamp-millis":
        src.long(indent, target)
        # fastavro adds timedelta(microseconds=v * 1000): the same value, half the cost.
        src.add(indent, f"{target} = _EPOCH + _timedelta(0, 0, 0, {target})")
        return {"utc_millis"}  # aware UTC, whole milliseconds: what UTC_MILLIS checks
    if kind == "enum" and isinstance(schema, dict):
        symbols = f"_symbols_{len(src.scope)}"
        src.scope[symbols] = tuple(schema["symbols"])
        src.long(indent, "i")
        src.add(indent, "if i < 0:", "    raise _Defer", f"{target} = {symbols}[i]")
        return {"str"}
    return None


def _read_union(
    src: _Source, branches: list[Schema], named: dict[str, Schema], indent: int, target: str
) -> set[str] | None:
    src.long(indent, "i")
    kinds: set[str] = set()
    for i, branch in enumerate(branches):
        src.add(indent, f"{'if' if i == 0 else 'elif'} i == {i}:")
        branch_kinds = _read_value(src, branch, named, indent + 1, target)
        if branch_kinds is None:
            return None
        kinds |= branch_kinds
    src.add(indent, "else:", "    raise _Defer")
    return kinds


def _test(check: Check, kinds: set[str]) -> str | None:
    """What is left to test of a value of these Python types (the types may already tell)."""
    if kinds == {"utc_millis"} and check == UTC_MILLIS:
        return None
    return check.rest if kinds <= _ADMITS[check.kind] else check.test


#: An enum symbol its field's check refuses (the standard path says why).
_REFUSED = object()


def _read_enum(src: _Source, schema: Schema, check: Check, target: str) -> None:
    """Lines reading an enum field into ``target``, its check and value decided per symbol.

    Both are pure functions of the symbol, so they are evaluated here, once per symbol.
    """
    values = []
    for symbol in schema["symbols"]:
        scope = {**src.scope, "v": symbol}
        ok = eval(check.test, scope)
        values.append(eval(check.value, scope) if ok else _REFUSED)
    table = f"_enum_{len(src.scope)}"
    src.scope.update({table: tuple(values), "_REFUSED": _REFUSED})
    src.long(1, "i")
    src.add(
        1,
        "if i < 0:",
        "    raise _Defer",
        f"{target} = {table}[i]",
        f"if {target} is _REFUSED:",
        "    raise _Defer",
    )


def _record_reader(
    schema: Schema,
    checks: ModelChecks,
    named: dict[str, Schema],
    bodies: tuple[Callable[..., Any], ...] = (),
) -> Callable[..., Any] | None:
    """A function ``(buf, pos, size) -> (model, pos)`` for one record type, or None.

    ``bodies`` reads the field ``checks.extra`` (a union of records), one reader a branch.
    """
    fields = [f["name"] for f in schema["fields"]]
    if set(fields) != {*checks.checks, *([checks.extra] if checks.extra else [])}:
        return None  # the schema and the model disagree: pydantic says how
    src = _Source()
    src.scope.update(checks.scope(), _bodies=bodies)
    src.add(0, "def read(buf, pos, size):")
    value_of: dict[str, str] = {}
    for i, field in enumerate(schema["fields"]):
        name = field["name"]
        if name == checks.extra:
            src.long(1, "i")
            src.add(1, "if i < 0:", "    raise _Defer", f"{name}, pos = _bodies[i](buf, pos, size)")
            continue
        value_of[name] = f"f{i}"
        field_type = _named(field["type"], named)
        if isinstance(field_type, dict) and field_type.get("type") == "enum":
            _read_enum(src, field_type, checks.checks[name], f"f{i}")
            continue
        # What the field's type tells decides the lines, so a dry run learns it first.
        kinds = _read_value(_Source(), field["type"], named, 1, "v")
        if kinds is None:
            return None
        check = checks.checks[name]
        test = _test(check, kinds)
        if test is None and check.value == "v":
            _read_value(src, field["type"], named, 1, f"f{i}")
            continue
        _read_value(src, field["type"], named, 1, "v")
        if test is not None:
            src.add(1, f"if not ({test}):", "    raise _Defer")
        src.add(1, f"f{i} = {check.value}")
    src.add(1, *checks.construct(value_of), "return m, pos")
    return src.compile("read")


def _defer(buf: bytes, pos: int, size: int) -> Any:
    raise _Defer


def compile_reader(schema: Schema, bodies: dict[str, type[BaseModel]]) -> EventReader | None:
    """A reader of events written with ``schema`` (fastavro-parsed), or None if it cannot be.

    ``bodies`` maps each body record's full name to its model.  A body type the reader does
    not handle gets the standard path (per value), the others keep the fast one.
    """
    named: dict[str, Schema] = dict(schema.get("__named_schemas", {}))
    envelope = checks_for(ev.Event, extra="body")
    field = next((f for f in schema.get("fields", ()) if f["name"] == "body"), None)
    if envelope is None or field is None or not isinstance(field["type"], list):
        return None
    readers = []
    for branch in field["type"]:
        record = _named(branch, named)
        model = bodies.get(record.get("name", "")) if isinstance(record, dict) else None
        checks = checks_for(model) if model is not None else None
        reader = _record_reader(record, checks, named) if checks is not None else None
        readers.append(reader or _defer)
    read = _record_reader(schema, envelope, named, tuple(readers))
    return None if read is None else whole_value(read)


def whole_value(
    walk: Callable[[bytes, int, int], tuple[T, int]],
) -> Callable[[bytes, int], T | None]:
    """A compiled walk ``(buf, pos, size) -> (result, end)`` over one value from ``offset``:
    its result when it read the whole value and nothing went wrong, else None (the caller
    takes the standard path)."""

    def whole(buf: bytes, offset: int) -> T | None:
        size = len(buf)
        try:
            result, end = walk(buf, offset, size)
        except Exception:  # any doubt (an index, a slice, UTF-8, a date): the standard path
            return None
        return result if end == size else None

    return whole

"""Avro binary writers compiled from a parsed schema: the codec's encoder for events.

fastavro's ``schemaless_writer`` walks the schema for every record it writes (~10 us an
event here, a third of the SDK's own work per step).  This compiles each record of a schema
once into a Python function that writes an object's fields in schema order, reading them
from its ``__dict__`` (pydantic models keep their fields there): ~3 us an event.

It knows what the event contract uses: null, boolean, int, long, string, bytes, enums,
records, unions of null and one type, unions of records (the branch is chosen by the
value's class, through ``record_types``), and ``timestamp-millis``.  A schema with anything
else raises :class:`Unsupported` when it is compiled, and the codec keeps fastavro for it.
The bytes are fastavro's, byte for byte: a test encodes events of every kind both ways.

Values are written as they are, unchecked, as fastavro writes them: the models bound every
integer to its Avro type and normalise every time (see :mod:`stepledger.domain.events`).
Where fastavro does check, so does this: the value of a union's boolean, int, long or time
branch must be of that kind (a plain boolean field takes any value's truthiness, as in
fastavro), and an integer past 64 bits is refused rather than written as a longer varint.
A value of the wrong kind raises ``TypeError``, ``KeyError``, ``AttributeError`` or
``ValueError`` (the codec turns each into a ``CodecError``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

Writer = Callable[[Any], bytes]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


class Unsupported(Exception):
    """The schema uses a type the compiler does not write (the codec falls back to fastavro)."""


def _varint(zigzag: int) -> bytes:
    out = bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


#: Every zigzag value below 2**11 as its varint: small ints, indexes, lengths below 1 KiB.
_SMALL = tuple(_varint(z) for z in range(1 << 11))
_SMALL_LENGTH = 1 << 10
#: The varint of ``zigzag >> 14`` for recent large values (times of one day share it).
_HIGH: dict[int, bytes] = {}


def write_long(value: int) -> bytes:
    """An Avro ``int`` or ``long``: zigzag, then a little-endian base-128 varint."""
    zigzag = (value << 1) ^ (value >> 63)
    if 0 <= zigzag < 2048:
        return _SMALL[zigzag]
    if zigzag < 16384:
        return _varint(zigzag)
    high = _HIGH.get(zigzag >> 14)
    if high is None:
        # Only a value within 64 bits is cached, so this check is made for every other one.
        if zigzag >> 64:
            raise ValueError(f"{value} does not fit an Avro long")  # fastavro: OverflowError
        if len(_HIGH) >= 256:
            _HIGH.clear()
        high = _HIGH[zigzag >> 14] = _varint(zigzag >> 14)
    return bytes(((zigzag & 0x7F) | 0x80, ((zigzag >> 7) & 0x7F) | 0x80)) + high


def write_string(value: str) -> bytes:
    """An Avro ``string``: its UTF-8 length, then the bytes."""
    data = value.encode()
    size = len(data)
    return (_SMALL[size + size] if size < _SMALL_LENGTH else write_long(size)) + data


def write_bytes(value: bytes) -> bytes:
    """An Avro ``bytes``: its length, then the bytes."""
    size = len(value)
    return (_SMALL[size + size] if size < _SMALL_LENGTH else write_long(size)) + value


def write_millis(value: datetime | int) -> bytes:
    """A ``timestamp-millis``: an aware time as milliseconds since the epoch (an int as is)."""
    if not isinstance(value, datetime):
        return write_long(value)
    zone = value.tzinfo
    if zone is None:
        raise TypeError("a naive time has no instant (fastavro would take it as local time)")
    if zone is not UTC or value.microsecond % 1000:
        # fastavro truncates: floor here.  Not only sub-millisecond times: in another zone
        # the offset may have microseconds (an offset of None raises TypeError, as naive).
        return write_long((value - _EPOCH) // _MILLISECOND)
    # Whole milliseconds in UTC (every event's times, normalised by the models): the float
    # is within 0.1 ms, 2x as fast.
    return write_long(round(value.timestamp() * 1000))


def union_boolean(value: Any) -> bytes:
    """A boolean branch of a union: only a bool (fastavro's union takes no other value)."""
    if value is True:
        return b"\x01"
    if value is False:
        return b"\x00"
    raise TypeError(f"{value!r} is not a boolean")


def union_int(value: Any) -> bytes:
    """An ``int`` branch of a union: a 32-bit int, not a bool (as fastavro's union checks)."""
    if type(value) is bool or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise TypeError(f"{value!r} is not an Avro int")
    return write_long(value)


def union_long(value: Any) -> bytes:
    """A ``long`` branch of a union: an int, not a bool (as fastavro's union checks)."""
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an Avro long")
    return write_long(value)


def union_millis(value: Any) -> bytes:
    """A ``timestamp-millis`` branch of a union: a time or an int, not a bool."""
    if type(value) is bool:
        raise TypeError(f"{value!r} is not a time")
    return write_millis(value)


_HELPERS: dict[str, Any] = {
    "_long": write_long,
    "_str": write_string,
    "_bytes": write_bytes,
    "_millis": write_millis,
    "_union_boolean": union_boolean,
    "_union_int": union_int,
    "_union_long": union_long,
    "_union_millis": union_millis,
}
#: A union branch whose value fastavro checks before writing it (see ``union``).
_STRICT_BRANCHES = {"boolean": "_union_boolean", "int": "_union_int", "long": "_union_long"}


class _ByClass(dict[type, Writer]):
    """A union's record writers by the value's class; a subclass takes its base's writer
    (fastavro chose the branch by the body's type tag, which a subclass inherits)."""

    def __missing__(self, cls: type) -> Writer:
        for base in cls.__mro__[1:]:
            if base in self:
                self[cls] = writer = self[base]
                return writer
        raise KeyError(cls)


class _Compiler:
    """Turns one schema into Python source: a function per record, per union of records."""

    def __init__(self, record_types: Mapping[str, type]) -> None:
        self.record_types = record_types
        self.names: dict[str, Any] = dict(_HELPERS)
        self.functions: list[str] = []
        self.records: dict[str, str] = {}
        self.named: dict[str, dict[str, Any]] = {}
        self.unions: list[tuple[_ByClass, list[tuple[type, str]]]] = []
        self.temporaries = 0

    def constant(self, value: Any) -> str:
        name = f"_k{len(self.names)}"
        self.names[name] = value
        return name

    def expression(self, schema: Any, value: str) -> str:
        """A Python expression giving the bytes of ``value`` (an expression) under ``schema``."""
        if isinstance(schema, list):
            return self.union(schema, value)
        if isinstance(schema, str):
            if schema in self.named:
                return self.expression(self.named[schema], value)
            schema = {"type": schema}
        kind = schema["type"]
        if isinstance(kind, dict | list):
            return self.expression(kind, value)
        logical = schema.get("logicalType")
        if kind == "long" and logical == "timestamp-millis":
            return f"_millis({value})"
        if logical is not None and kind != "string":
            raise Unsupported(f"logical type {logical}")
        if kind in ("int", "long"):
            return f"_long({value})"
        if kind == "string":
            return f"_str({value})"
        if kind == "bytes":
            return f"_bytes({value})"
        if kind == "boolean":
            return f"(b'\\x01' if {value} else b'\\x00')"
        if kind == "null":
            return "b''"
        if kind == "enum":
            self.note(schema)
            symbols = {symbol: write_long(i) for i, symbol in enumerate(schema["symbols"])}
            return f"{self.constant(symbols)}[{value}]"
        if kind == "record":
            return f"{self.record(schema)}({value})"
        if kind in self.named:
            return self.expression(self.named[kind], value)
        raise Unsupported(f"type {kind!r}")

    def note(self, schema: dict[str, Any]) -> str:
        name = str(schema["name"])
        self.named.setdefault(name, schema)
        return name

    def record(self, schema: dict[str, Any], prefix: bytes = b"") -> str:
        """The name of a function writing the record (``prefix`` first: a union's index)."""
        name = self.note(schema)
        key = f"{name}/{prefix.hex()}"
        if key in self.records:
            return self.records[key]
        function = f"_record{len(self.records)}"
        self.records[key] = function
        parts = [repr(prefix)] if prefix else []
        parts += [self.expression(f["type"], f"d[{f['name']!r}]") for f in schema["fields"]]
        self.functions.append(
            f"def {function}(v):\n    d = v.__dict__\n    return b''.join(({', '.join(parts)},))"
        )
        return function

    def union(self, branches: list[Any], value: str) -> str:
        kinds = [_kind(b) for b in branches]
        if len(branches) == 2 and "null" in kinds:
            null = kinds.index("null")
            self.temporaries += 1
            held = f"x{self.temporaries}"
            branch = branches[1 - null]
            strict = _strict_branch(branch)
            # fastavro writes a plain boolean field as the value's truthiness, but picks a
            # union's branch by checking the value's kind, and refuses one that fits none.
            other = f"{strict}({held})" if strict else self.expression(branch, held)
            index = write_long(1 - null)
            return f"({write_long(null)!r} if ({held} := {value}) is None else {index!r} + {other})"
        if all(k == "record" for k in kinds):
            return self.record_union(branches, value)
        raise Unsupported(f"union {kinds}")

    def record_union(self, branches: list[Any], value: str) -> str:
        by_class = _ByClass()
        writers = []
        for index, branch in enumerate(branches):
            schema = self.named[branch] if isinstance(branch, str) else branch
            name = self.note(schema)
            if name not in self.record_types:
                raise Unsupported(f"no class for record {name}")
            writers.append((self.record_types[name], self.record(schema, write_long(index))))
        self.unions.append((by_class, writers))
        # A value of a class no branch names (nor a base of it) raises KeyError (fastavro:
        # ValueError).
        return f"{self.constant(by_class)}[{value}.__class__]({value})"


def _strict_branch(schema: Any) -> str | None:
    """The checking writer of a union branch fastavro checks the value of, if any."""
    if isinstance(schema, str):
        return _STRICT_BRANCHES.get(schema)
    if not isinstance(schema, dict) or not isinstance(schema.get("type"), str):
        return None
    logical = schema.get("logicalType")
    if logical is None:
        return _STRICT_BRANCHES.get(schema["type"])
    millis = schema["type"] == "long" and logical == "timestamp-millis"
    return "_union_millis" if millis else None


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema if schema in _PRIMITIVES else "record"
    kind = schema["type"] if isinstance(schema, dict) else "union"
    return kind if isinstance(kind, str) else "union"


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def compile_writer(
    schema: dict[str, Any], record_types: Mapping[str, type], prefix: bytes = b""
) -> Writer:
    """A function writing an object of the record ``schema`` (``prefix`` first) as Avro.

    ``schema`` is parsed (fastavro's ``load_schema``/``parse_schema``: named types inlined
    where first used); ``record_types`` names the class of each record that is a branch of
    a union of records.  Raises Unsupported if the schema uses a type this does not write.
    """
    if schema.get("type") != "record":
        raise Unsupported("the top-level schema is not a record")
    compiler = _Compiler(record_types)
    top = compiler.record(schema, prefix)
    namespace = dict(compiler.names)
    exec("\n\n".join(compiler.functions), namespace)  # the source is built above, from the schema
    for by_class, writers in compiler.unions:
        by_class.update((cls, namespace[function]) for cls, function in writers)
    writer: Writer = namespace[top]
    return writer

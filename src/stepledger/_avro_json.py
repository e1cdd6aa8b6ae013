"""An event's JSON straight from the Avro bytes of the codec's own schema, as the models write it.

The recovery daemon keeps a tracked step's events as Avro values and its checkpoints store
them as JSON lines, the JSON ``Event.model_dump_json`` writes.  Decoding a value into the
models to dump them costs both (~30 µs per intent on the 2-core machine, where the dump
alone is ~11 µs), which is why the daemon used to make each line as the step changed and
hold it until the checkpoint: more than the step's own memory again.  The writer compiled
here walks the bytes once, field by field in the schema's order (the reading lines of
:mod:`stepledger._avro_read`), and writes each field as pydantic does: strings escaped as
``json.encoder.encode_basestring`` escapes them, times as ``isoformat`` with ``Z`` (from
the integer, no ``datetime`` built), enums as their symbols, all fields in the model's
order with the body's ``type`` tag first: ~17 µs per intent there.

It gives None for anything outside the subset the compiled reader reads (a short or
corrupt value, a date past ``datetime``'s range), for a field type it does not write (a
nullable time, say) and for a schema that does not mirror the models field for field; the
caller then decodes and dumps.  It does not check the models' rules: it is for values
decoded before (a line it writes for one they refuse is refused when loaded).  A test
compares it with ``model_dump_json`` on every event type, every escaped character and the
edges of time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import date
from json.encoder import encode_basestring
from typing import Any

from pydantic import BaseModel

from stepledger._avro_read import Schema, _defer, _named, _read_value, _Source, whole_value
from stepledger.domain import events as ev

#: Writes one event's JSON from a value and the offset of its Avro body; None: decode and dump.
EventJson = Callable[[bytes, int], "str | None"]


_MS_PER_DAY = 86_400_000
#: Days from 0001-01-01 to 1970-01-01, and the last day ``datetime`` holds (9999-12-31).
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896
_EPOCH_ORDINAL = 719_163
#: The time of day in pieces, as ``isoformat`` writes them: "HH:MM:" per minute, "SS" per
#: second, the fraction per millisecond (none for a whole second).
_MINUTES = tuple(f"{m // 60:02}:{m % 60:02}:" for m in range(1440))
_SECONDS = tuple(f"{s:02}" for s in range(60))
_MILLIS = ('Z"', *(f'.{ms:03}000Z"' for ms in range(1, 1000)))


@functools.lru_cache(maxsize=4096)
def _day(days: int) -> str:
    return f'"{date.fromordinal(_EPOCH_ORDINAL + days).isoformat()}T'


def _millis(ms: int) -> str:
    """A timestamp-millis as pydantic writes the time it reads as (aware UTC)."""
    days, rest = divmod(ms, _MS_PER_DAY)
    if not _FIRST_DAY <= days <= _LAST_DAY:
        raise OverflowError(f"{ms} ms is past the dates datetime holds")
    seconds, milli = divmod(rest, 1000)
    minutes, second = divmod(seconds, 60)
    return _day(days) + _MINUTES[minutes] + _SECONDS[second] + _MILLIS[milli]


_TIMESTAMP = {"type": "long", "logicalType": "timestamp-millis"}
_SCOPE = {"_s": encode_basestring, "_ms": _millis}


def _json_of(kinds: set[str], var: str) -> str | None:
    """An expression writing ``var`` (of these Python types) as JSON, None if not handled."""
    if "None" in kinds and len(kinds) > 1:
        rest = _json_of(kinds - {"None"}, var)
        return None if rest is None else f'("null" if {var} is None else {rest})'
    if kinds == {"None"}:
        return '"null"'
    if kinds == {"str"}:
        return f"_s({var})"
    if kinds == {"int"}:
        return f"str({var})"
    if kinds == {"bool"}:
        return f'("true" if {var} else "false")'
    return None


def _record_json(
    schema: Schema,
    model: type[BaseModel],
    named: dict[str, Schema],
    bodies: tuple[Callable[..., Any], ...] = (),
    body: str | None = None,
) -> Callable[..., Any] | None:
    """A function ``(buf, pos, size) -> (json, pos)`` for one record type, or None.

    ``body`` names the field read by ``bodies`` (a union of records, one writer a branch).
    """
    fields = [f["name"] for f in schema["fields"]]
    tag = model.model_fields.get("type")
    if list(model.model_fields) != (["type"] if tag is not None else []) + fields:
        return None  # the schema and the model disagree (names or order): dump the model
    src = _Source()
    src.scope.update(_SCOPE, _bodies=bodies)
    src.add(0, "def write(buf, pos, size):")
    text = "{" if tag is None else '{"type":' + json.dumps(tag.default)
    parts: list[str] = []
    for i, field in enumerate(schema["fields"]):
        name, target = field["name"], f"f{i}"
        if name == body:
            src.long(1, "i")
            src.add(1, "if i < 0:", "    raise _Defer")
            src.add(1, f"{target}, pos = _bodies[i](buf, pos, size)")
            expr: str | None = target
        elif _named(field["type"], named) == _TIMESTAMP:
            src.long(1, target)  # written from the integer: no datetime built
            expr = f"_ms({target})"
        else:
            kinds = _read_value(src, field["type"], named, 1, target)
            expr = None if kinds is None else _json_of(kinds, target)
        if expr is None:
            return None
        comma = "" if i == 0 and tag is None else ","
        parts += [_literal(comma + json.dumps(name) + ":"), "{" + expr + "}"]
    # One f-string builds the text at once (joining 40 parts with + copied it 40 times).
    body_text = _literal(text) + "".join(parts) + "}}"
    src.add(1, "return f" + "'" * 3 + body_text + "'" * 3 + ", pos")
    return src.compile("write")


def _literal(text: str) -> str:
    """``text`` as literal text of a generated f-string (names and tags: no quote, no escape)."""
    if "'" in text or "\\" in text:
        raise ValueError(f"not a plain literal: {text!r}")
    return text.replace("{", "{{").replace("}", "}}")


def compile_json(schema: Schema, bodies: dict[str, type[BaseModel]]) -> EventJson | None:
    """A JSON writer of events written with ``schema`` (fastavro-parsed), or None.

    ``bodies`` maps each body record's full name to its model.  A body type it cannot write
    gets None per value (the caller dumps the model); the others keep the fast path.
    """
    named: dict[str, Schema] = dict(schema.get("__named_schemas", {}))
    field = next((f for f in schema.get("fields", ()) if f["name"] == "body"), None)
    if field is None or not isinstance(field["type"], list):
        return None
    writers = []
    for branch in field["type"]:
        record = _named(branch, named)
        model = bodies.get(record.get("name", "")) if isinstance(record, dict) else None
        writer = _record_json(record, model, named) if model is not None else None
        writers.append(writer or _defer)
    write = _record_json(schema, ev.Event, named, tuple(writers), body="body")
    return None if write is None else whole_value(write)

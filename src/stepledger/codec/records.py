"""Named records other than events (``schemas/NAME.avsc``): the checkpoint topic's records.

Each is framed as an event is without a registry, as Avro single-object encoding (``C3 01``
+ the CRC-64-AVRO fingerprint of its schema + the body), and written and read by fastavro.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from typing import Any, cast

import fastavro
from fastavro.schema import load_schema

from stepledger.codec.core import SINGLE_OBJECT_MAGIC, schema_dir, single_object_fingerprint
from stepledger.errors import CodecError


@functools.cache
def record_schema(name: str) -> dict[str, Any]:
    """A packaged record schema other than the envelope (``schemas/NAME.avsc``), parsed once."""
    path = schema_dir() / f"{name}.avsc"
    try:
        return cast(dict[str, Any], load_schema(str(path)))
    except (OSError, ValueError, fastavro.schema.SchemaParseException) as exc:
        raise CodecError(f"cannot load schema {path}: {exc}") from exc


@functools.cache
def record_prefix(name: str) -> bytes:
    """The single-object header of a record written with :func:`record_schema` ``(name)``."""
    return SINGLE_OBJECT_MAGIC + single_object_fingerprint(record_schema(name))


def write_record(name: str, record: Mapping[str, Any]) -> bytes:
    """The framed Avro bytes of a record of the named schema (its fields as a mapping)."""
    buf = io.BytesIO()
    buf.write(record_prefix(name))
    fastavro.schemaless_writer(buf, record_schema(name), record)
    return buf.getvalue()


def read_record(name: str, data: bytes | None, what: str) -> dict[str, Any]:
    """The fields of a framed record of the named schema; anything else raises CodecError
    (``what`` names the record in the error)."""
    prefix = record_prefix(name)
    if not data or not data.startswith(prefix):
        raise CodecError(f"not a {name.rpartition('.')[2]} in single-object encoding")
    try:
        raw = fastavro.schemaless_reader(io.BytesIO(data[len(prefix) :]), record_schema(name), None)
    except Exception as exc:  # fastavro raises many types on corrupt input
        raise CodecError(f"undecodable {what}: {type(exc).__name__}: {exc}") from exc
    return cast(dict[str, Any], raw)

"""Events to and from wire bytes: the codec between the domain's models and the step log.

Model -> dict -> Avro bytes (fastavro's schemaless writer) and bytes -> model: a value of
the codec's own schema by the reader compiled from it (:mod:`stepledger.codec.reader`: the
recovery daemon's replay and restart earn it, docs/benchmarks.md "Fast paths and their
A/B"), any other by fastavro's schemaless reader and pydantic's validation
(``Codec(compiled=False)``: every value so; the tests run both).  Values are framed either
as Avro single-object encoding (``C3 01`` + 8-byte little-endian CRC-64-AVRO fingerprint + body; the
default) or with Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id) when
a registry is configured.  The reader accepts both.  Schemas are parsed once per codec.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, cast

import fastavro
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from pydantic import BaseModel, ValidationError

from stepledger.codec.reader import EventReader, compile_reader
from stepledger.domain.events import BODY_TYPES, Event
from stepledger.errors import (
    CodecError,
    EventValidationError,
    ForeignFleetError,
    UnknownSchemaError,
)
from stepledger.kafka.registry import RegistryError, SchemaRegistry

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
REGISTRY_MAGIC = b"\x00"
NAMESPACE = "stepledger"
ENVELOPE = f"{NAMESPACE}.Event"

_BODY_BY_NAME: dict[str, type[BaseModel]] = {f"{NAMESPACE}.{t.__name__}": t for t in BODY_TYPES}
_NAME_BY_TYPE: dict[str, str] = {
    t.model_fields["type"].default: name for name, t in _BODY_BY_NAME.items()
}


def schema_dir() -> Path:
    """Return the directory of the packaged ``.avsc`` contract."""
    return Path(str(resources.files("stepledger").joinpath("schemas")))


def load_envelope_schema(directory: Path | None = None) -> dict[str, Any]:
    """Load and parse the envelope schema with every named type it references."""
    path = (directory or schema_dir()) / f"{ENVELOPE}.avsc"
    try:
        return cast(dict[str, Any], load_schema(str(path)))
    except (OSError, ValueError, fastavro.schema.SchemaParseException) as exc:
        raise CodecError(f"cannot load schema {path}: {exc}") from exc


def released_writer_schemas(directory: Path | None = None) -> list[dict[str, Any]]:
    """The envelope schema of every released version of the contract (schemas/released/)."""
    root = (directory or schema_dir()) / "released"
    if not root.is_dir():
        return []
    return [
        load_envelope_schema(version)
        for version in sorted(root.iterdir())
        if (version / f"{ENVELOPE}.avsc").exists()
    ]


@functools.cache
def _current() -> dict[str, Any]:
    return load_envelope_schema()


@functools.cache
def _released() -> tuple[dict[str, Any], ...]:
    return tuple(released_writer_schemas())


def single_object_fingerprint(schema: dict[str, Any]) -> bytes:
    """Return the 8-byte CRC-64-AVRO fingerprint the single-object header carries."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


@functools.cache
def _current_fingerprint() -> bytes:
    # fastavro computes the fingerprint in pure Python, slowly: once per process.
    return single_object_fingerprint(_current())


@functools.cache
def _released_by_fingerprint() -> dict[bytes, dict[str, Any]]:
    return {single_object_fingerprint(s): s for s in _released()}


def to_record(event: Event) -> dict[str, Any]:
    """Turn an event into the dict fastavro writes (the body as a named union branch).

    Read from the models' fields directly (every field is a scalar, an enum or a time):
    ``model_dump`` would serialise the same values again on every event.
    """
    record = dict(event.__dict__)
    body = dict(record["body"].__dict__)
    record["body"] = (_NAME_BY_TYPE[body.pop("type")], body)
    return record


@functools.cache
def _current_reader() -> EventReader | None:
    # Compiling costs many decodes: once a process for the packaged schema, at the first one.
    return compile_reader(_current(), _BODY_BY_NAME)


def from_record(record: dict[str, Any]) -> Event:
    """Turn a dict fastavro read (with record names) into a validated event."""
    name, body = record["body"]
    if name not in _BODY_BY_NAME:
        raise EventValidationError(f"unknown event type {name!r}")
    body_type = _BODY_BY_NAME[name].model_fields["type"].default
    try:
        return Event.model_validate({**record, "body": {**body, "type": body_type}})
    except ValidationError as exc:
        raise EventValidationError(f"invalid {name}: {_first_error(exc)}") from exc


class RegistryFraming:
    """Confluent Schema Registry framing: registers the writer schema, resolves ids on read."""

    def __init__(self, url: str, subject: str, conf: dict[str, str] | None = None) -> None:
        self._client = SchemaRegistry(url, conf)
        self._subject = subject
        self._schemas: dict[int, dict[str, Any]] = {}

    def register(self, schema: dict[str, Any]) -> int:
        """Register the writer schema under the subject and return its id."""
        try:
            schema_id = self._client.register(self._subject, to_parsing_canonical_form(schema))
        except Exception as exc:  # a schema fastavro cannot parse, or the registry's refusal
            raise CodecError(f"schema registry refused the schema: {exc}", retryable=True) from exc
        self._schemas[schema_id] = schema
        return schema_id

    def writer_schema(self, schema_id: int) -> dict[str, Any]:
        """Return the parsed schema for a registry id, fetching it once."""
        if schema_id not in self._schemas:
            try:
                text = self._client.schema_text(schema_id)
            except RegistryError as exc:
                raise UnknownSchemaError(f"schema id {schema_id} not in registry: {exc}") from exc
            parsed = fastavro.parse_schema(json.loads(text))
            self._schemas[schema_id] = cast(dict[str, Any], parsed)
        return self._schemas[schema_id]


class Codec:
    """Encode events to bytes and decode bytes to events, in either framing."""

    def __init__(
        self,
        schema: dict[str, Any] | None = None,
        *,
        registry: RegistryFraming | None = None,
        known_writer_schemas: Iterable[dict[str, Any]] = (),
        compiled: bool = True,
        fleet: str | None = None,
    ) -> None:
        """``compiled``: read values of this codec's own schema with the compiled reader
        (False: fastavro and the models read every value, the path it must agree with).
        ``fleet``: the fleet whose step log this codec reads (a fleet role's config pins
        it); an event that names another is refused, so no reader applies it."""
        self.fleet = fleet
        self.schema = schema if schema is not None else _current()
        self._compiled = compiled
        self._fingerprint = (
            _current_fingerprint() if schema is None else single_object_fingerprint(schema)
        )
        # Old producers may still write with a released schema: a reader knows them all.
        self._writers = dict(_released_by_fingerprint())
        self._writers.update((single_object_fingerprint(s), s) for s in known_writer_schemas)
        self._registry = registry
        self._registry_id = registry.register(self.schema) if registry else None
        self._prefix = (
            REGISTRY_MAGIC + self._registry_id.to_bytes(4, "big")
            if self._registry_id is not None
            else SINGLE_OBJECT_MAGIC + self._fingerprint
        )

    @property
    def prefix(self) -> bytes:
        """The framing every value this codec encodes starts with."""
        return self._prefix

    def encode(self, event: Event) -> bytes:
        """Return the framed Avro bytes of one event."""
        buf = io.BytesIO(self._prefix)
        buf.seek(len(self._prefix))
        try:
            fastavro.schemaless_writer(buf, self.schema, to_record(event))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise CodecError(f"cannot encode {event.type} {event.event_id}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes | None) -> Event:
        """Return the event in framed Avro bytes; any defect raises a CodecError subclass,
        an event of another fleet than the codec's ``fleet`` a ForeignFleetError."""
        event = self._decode(data)
        if self.fleet is not None and event.fleet_id != self.fleet:
            raise ForeignFleetError(
                f"event {event.event_id} claims fleet {event.fleet_id!r} in the step log "
                f"of fleet {self.fleet!r}: refused, never applied",
                workflow_id=event.workflow_id,
            )
        return event

    def _decode(self, data: bytes | None) -> Event:
        """The event in framed Avro bytes, whatever fleet it names.

        A value written with this codec's schema is read by the compiled reader; whatever
        it declines (another writer schema, a defect, an invalid event) is read by fastavro
        and checked by the models, which accept it or say why not.
        """
        compiled = self._compiled_reader
        prefix = self._prefix
        if compiled is not None and type(data) is bytes and data.startswith(prefix):
            event = compiled(data, len(prefix))
            if event is not None:
                return event
        writer, offset = self._writer_for(data)
        reader = None if writer is self.schema else self.schema
        try:
            record = fastavro.schemaless_reader(
                io.BytesIO(memoryview(data)[offset:]),  # type: ignore[arg-type]
                writer,
                reader,
                return_record_name=True,
            )
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise CodecError(f"undecodable Avro body: {type(exc).__name__}: {exc}") from exc
        return from_record(cast(dict[str, Any], record))

    def to_json(self, data: bytes) -> str:
        """The event in framed Avro bytes as ``Event.model_dump_json`` writes it."""
        return self.decode(data).model_dump_json()

    @functools.cached_property
    def _compiled_reader(self) -> EventReader | None:
        """The reader compiled for this codec's schema (built at the first decode)."""
        if not self._compiled:
            return None
        if self.schema is _current():
            return _current_reader()
        return compile_reader(self.schema, _BODY_BY_NAME)

    def _writer_for(self, data: bytes | None) -> tuple[dict[str, Any], int]:
        if not data or len(data) < 5:
            raise CodecError("value is empty or too short to be a framed Avro event")
        if data[:2] == SINGLE_OBJECT_MAGIC and len(data) >= 10:
            fp = bytes(data[2:10])
            if fp == self._fingerprint:
                return self.schema, 10
            if fp in self._writers:
                return self._writers[fp], 10
            raise UnknownSchemaError(f"unknown schema fingerprint {fp.hex()}")
        if data[:1] == REGISTRY_MAGIC:
            schema_id = int.from_bytes(data[1:5], "big")
            if self._registry is None:
                raise UnknownSchemaError(
                    f"registry-framed value (schema id {schema_id}) but no registry configured"
                )
            writer = self._registry.writer_schema(schema_id)
            return (self.schema if schema_id == self._registry_id else writer), 5
        raise CodecError(f"unknown framing (first bytes {bytes(data[:2]).hex()})")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"

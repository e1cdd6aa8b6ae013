"""Every codec of stepledger in one package: what turns its values into bytes and back.

- :mod:`~stepledger.codec.core`: events to and from framed Avro bytes (:class:`Codec`), the
  packaged schemas and the schema registry's framing;
- :mod:`~stepledger.codec.reader` and :mod:`~stepledger.codec.checks`: the reader compiled
  from the schema and the models' checks, the codec's one fast path (``Codec(compiled=False)``
  turns it off);
- :mod:`~stepledger.codec.records`: the checkpoint topic's records, framed as events are;
- :mod:`~stepledger.codec.jsonlines`: events as JSON lines (the CLI's input and output).

The import contract ``codec-one-package`` keeps fastavro inside it.
"""

from stepledger.codec.core import (
    ENVELOPE,
    NAMESPACE,
    REGISTRY_MAGIC,
    SINGLE_OBJECT_MAGIC,
    Codec,
    RegistryFraming,
    from_record,
    load_envelope_schema,
    released_writer_schemas,
    schema_dir,
    single_object_fingerprint,
    to_record,
)
from stepledger.codec.records import read_record, record_prefix, record_schema, write_record

__all__ = [
    "ENVELOPE",
    "NAMESPACE",
    "REGISTRY_MAGIC",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "RegistryFraming",
    "from_record",
    "load_envelope_schema",
    "read_record",
    "record_prefix",
    "record_schema",
    "released_writer_schemas",
    "schema_dir",
    "single_object_fingerprint",
    "to_record",
    "write_record",
]

"""The Confluent Schema Registry, as the codec's registry framing asks it.

Its HTTP client ships with confluent-kafka, so it is reached here like every other part of
that package; what leaves is ids and schema texts, and errors as :class:`RegistryError`.
"""

from __future__ import annotations

from typing import Any


class RegistryError(Exception):
    """The registry refused a request or could not be reached (the codec says which)."""


class SchemaRegistry:
    """One registry: Avro schemas registered under a subject, looked up by id."""

    def __init__(self, url: str, conf: dict[str, str] | None = None) -> None:
        # Imported when a registry is used: its HTTP stack is not loaded by every import.
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self._client: Any = SchemaRegistryClient.new_client({"url": url, **(conf or {})})

    def register(self, subject: str, text: str) -> int:
        """Register an Avro schema (its canonical text) under ``subject``; its id."""
        from confluent_kafka.schema_registry import Schema

        try:
            return int(self._client.register_schema(subject, Schema(text, "AVRO")))
        except Exception as exc:  # the client raises its own and transport errors alike
            raise RegistryError(str(exc)) from exc

    def schema_text(self, schema_id: int) -> str:
        """The text of the schema registered with ``schema_id``."""
        try:
            return str(self._client.get_schema(schema_id).schema_str)
        except Exception as exc:
            raise RegistryError(str(exc)) from exc

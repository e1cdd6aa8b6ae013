"""A consumed record's headers are taken from the client as they are: bytes, or None."""

from __future__ import annotations

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.kafka.reader import read_topic
from tests.integration.projector_helpers import produce_raw


def test_headers_produced_as_text_bytes_or_nothing_are_read_as_bytes_or_none(
    settings: Settings,
) -> None:
    # message_headers no longer rebuilds the pairs: the client must hand bytes (or None)
    # for every value, whatever the producer gave it.
    headers = [("text", "été"), ("raw", b"\x00\xff"), ("empty", b""), ("none", None)]
    produce_raw(settings, [(b"k", b"not an event", headers)])  # type: ignore[list-item]
    (record,) = list(read_topic(settings, Codec(), idle_timeout=0.3))
    assert record.headers == [
        ("text", "été".encode()),
        ("raw", b"\x00\xff"),
        ("empty", b""),
        ("none", None),
    ]
    assert all(type(v) is bytes for _, v in record.headers[:3])

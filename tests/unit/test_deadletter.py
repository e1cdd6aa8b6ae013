"""Every dead letter fits the producer's limit; a cut one says so and is never replayed."""

from __future__ import annotations

import pytest

from stepledger.config import Settings
from stepledger.deadletters.letter import (
    TRUNCATED,
    DeadLetter,
    dead_letter_info,
    max_message_bytes,
    original_headers,
)
from stepledger.deadletters.readback import StoredLetter, replay_letters
from stepledger.errors import ConfigError
from stepledger.kafka import Headers, Position

LIMIT = 1_000_000


def size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    return len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"k", b"v" * 999_000, []),
        (None, b"v" * 5_000_000, [("h", None)]),
        (b"k" * 2_000_000, None, []),
        (b"k", b"v", [("big", b"h" * 3_000_000), ("h", None)]),
        (b"k", b"v" * 10, [("h", b"x")]),
    ],
)
def test_a_letter_is_cut_to_fit_the_limit_keeping_its_coordinates(
    key: bytes | None, value: bytes | None, headers: Headers
) -> None:
    letter = DeadLetter(key, value, headers, Position("t", 2, 7), "decode", "e" * 5000, "g")
    k, v, h = letter.fitted(LIMIT)
    assert size(k, v, h) <= LIMIT - 512
    info = dead_letter_info(h)
    assert (info["topic"], info["partition"], info["offset"]) == ("t", "2", "7")
    whole = size(key, value, letter.all_headers()) <= LIMIT - 1024
    assert (TRUNCATED not in info) == whole
    if whole:
        assert (k, v, original_headers(h)) == (key, value, headers)
    else:
        assert (v is None) == (value is None) and (value or b"").startswith(v or b"")


def test_the_limit_follows_the_producer_setting() -> None:
    assert max_message_bytes(Settings()) == LIMIT
    assert max_message_bytes(Settings(kafka={"message.max.bytes": "2000000"})) == 2_000_000


def test_a_cut_letter_is_not_replayed() -> None:
    info = {"truncated": "value 5000000 bytes", "topic": "t"}
    letter = StoredLetter(Position("dlq", 0, 3), b"k", b"v", [], info)
    with pytest.raises(ConfigError, match="0:3"):
        replay_letters(Settings(), [letter])

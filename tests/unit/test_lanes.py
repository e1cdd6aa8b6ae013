"""Which client a durable record goes to: lingering only under load, a key on one client
while any of its records is in flight."""

from __future__ import annotations

from stepledger.config import Settings
from stepledger.kafka import Batching, DurableProducer
from stepledger.kafka.lanes import LINGERING, PROMPT, Lanes

TOPIC = "t"


def test_records_linger_only_once_the_load_is_reached() -> None:
    lanes = Lanes(Batching(linger_ms=1, from_in_flight=2))
    got: list[object] = []
    first = lanes.take(TOPIC, b"a", None, got.append)
    second = lanes.take(TOPIC, b"b", None, got.append)
    third = lanes.take(TOPIC, b"c", None, got.append)
    assert [first[0], second[0], third[0]] == [PROMPT, PROMPT, LINGERING]
    assert lanes.in_flight == 3
    for _, landed, _ in (first, second, third):
        landed("ok")
    assert got == ["ok", "ok", "ok"] and lanes.in_flight == 0
    assert lanes.take(TOPIC, b"d", None, got.append)[0] == PROMPT  # the load is gone


def test_a_key_stays_on_its_client_while_a_record_of_it_is_in_flight() -> None:
    lanes = Lanes(Batching(linger_ms=1, from_in_flight=2))
    a = lanes.take(TOPIC, b"a", None, print)
    b = lanes.take(TOPIC, b"b", None, print)
    lingering = lanes.take(TOPIC, b"k", None, print)
    assert lingering[0] == LINGERING
    a[1]("ok")
    b[1]("ok")  # the load is gone, but k's first record still lingers
    again = lanes.take(TOPIC, b"k", None, print)
    assert again[0] == LINGERING
    loaded = [lanes.take(TOPIC, bytes([n]), None, print) for n in range(3)]
    assert loaded[-1][0] == LINGERING
    lingering[1]("ok")
    again[1]("ok")
    for _, landed, _ in loaded:
        landed("ok")
    assert lanes.take(TOPIC, b"k", None, print)[0] == PROMPT  # nothing of k in flight


def test_a_refused_record_is_forgotten_and_never_lingers_when_told_not_to() -> None:
    lanes = Lanes(Batching(linger_ms=1, from_in_flight=1))
    held = lanes.take(TOPIC, b"a", None, print)
    refused = lanes.take(TOPIC, b"b", None, print, may_linger=False)
    assert refused[0] == PROMPT
    refused[2]()
    assert lanes.in_flight == 1
    held[2]()
    assert lanes.in_flight == 0
    # Explicit partitions are held by partition, not by key.
    p0 = lanes.take(TOPIC, None, 0, print)
    assert lanes.take(TOPIC, b"x", 0, print)[0] == p0[0]


def test_no_second_client_when_the_user_set_a_linger_or_batching_is_off() -> None:
    plain = Settings(bootstrap="127.0.0.1:9")
    assert DurableProducer(plain, batching=Batching())._lingering is not None
    assert DurableProducer(plain)._lingering is None
    assert DurableProducer(plain, batching=Batching(linger_ms=0))._lingering is None
    for key in ("linger.ms", "queue.buffering.max.ms"):
        mine = Settings(bootstrap="127.0.0.1:9", kafka={key: "5"})
        assert DurableProducer(mine, batching=Batching())._lingering is None

"""A step log's identity on state records: whose a record is, and what a reader refuses."""

from __future__ import annotations

import logging

import pytest

from stepledger import wire
from stepledger.kafka.logid import LogIdentity, Origin, Refusals, named_in, stamped

OWN = LogIdentity("events", "lsvKBaINTsW0J7Cm3Q2/WQ")


def test_the_header_names_the_topic_and_its_id() -> None:
    assert OWN.header == (wire.LOG_IDENTITY_HEADER, b"events@lsvKBaINTsW0J7Cm3Q2/WQ")


@pytest.mark.parametrize(
    ("headers", "origin"),
    [
        ([OWN.header], Origin.OWN),
        ({wire.LOG_IDENTITY_HEADER: str(OWN)}, Origin.OWN),
        ([(wire.LOG_IDENTITY_HEADER, b"events@another-id")], Origin.FOREIGN),
        ([(wire.LOG_IDENTITY_HEADER, b"orders@lsvKBaINTsW0J7Cm3Q2/WQ")], Origin.FOREIGN),
        ([("stepledger_directory", b"12")], Origin.UNNAMED),
        (None, Origin.UNNAMED),
        ([(wire.LOG_IDENTITY_HEADER, None)], Origin.UNNAMED),
    ],
)
def test_whose_a_record_is(headers: object, origin: Origin) -> None:
    assert OWN.origin(headers) is origin  # type: ignore[arg-type]


def test_stamping_replaces_any_other_identity_and_keeps_the_rest() -> None:
    given: list[tuple[str, str | bytes | None]] = [
        ("stepledger_directory", "12"),
        (wire.LOG_IDENTITY_HEADER, b"x@y"),
    ]
    assert stamped(OWN, given) == [("stepledger_directory", b"12"), OWN.header]
    assert named_in(stamped(OWN)) == str(OWN)


def test_refused_records_are_counted_and_said_once_per_topic_and_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals(OWN, "checkpoints")
    caplog.set_level(logging.WARNING, logger="stepledger.kafka.logid")
    assert refusals.admit("ckpt", 0, [OWN.header])
    foreign = [(wire.LOG_IDENTITY_HEADER, b"orders@B")]
    for _ in range(3):
        assert not refusals.admit("ckpt", 0, foreign)
        assert not refusals.admit("ckpt", 1, None)
    assert refusals.counts == {("ckpt", "orders@B"): 3, ("ckpt", "-"): 3}
    assert refusals.total == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "names another step log (orders@B)" in lines[0] and "names no step log" in lines[1]

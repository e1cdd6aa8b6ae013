"""The daemon's own acknowledged decisions are folded, when read back, as the events it sent:
only a record at the acknowledged partition and offset, carrying the sent event's id, is."""

from __future__ import annotations

from stepledger.codec import Codec
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.state import StepState, StepStatus
from stepledger.kafka import Position
from stepledger.kafka.records import Consumed
from stepledger.log import event_headers
from stepledger.recovery.echoes import Echoes
from stepledger.resolution.resolver import Resolution
from tests.unit.factories import factory


def _decided() -> Resolution:
    outcome = factory().outcome(
        "wf", "s", attempt=1, status=OutcomeStatus.SUCCEEDED, source=Source.RECOVERY_QUERY
    )
    step = StepState("s", StepStatus.SUCCEEDED)
    return Resolution(
        step, rs.Action(rs.ActionKind.QUERY, 1), (outcome,), (Position("log", 2, 40),)
    )


def _record(resolution: Resolution, topic: str = "log", offset: int = 40) -> Consumed:
    event = resolution.events[0]
    value = Codec().encode(event)
    return Consumed(topic, 2, offset, b"wf", value, event_headers(event))


def test_a_decision_read_back_where_it_was_acknowledged_is_the_event_sent() -> None:
    echoes, resolution = Echoes("log"), _decided()
    echoes.expect(resolution)
    assert echoes.take(_record(resolution)) is resolution.events[0]
    assert echoes.take(_record(resolution)) is None  # taken once


def test_any_other_record_is_decoded() -> None:
    echoes, resolution = Echoes("log"), _decided()
    echoes.expect(resolution)
    assert echoes.take(_record(resolution, offset=41)) is None
    assert echoes.take(_record(resolution, topic="other")) is None
    sent = _record(resolution)
    headers = [(k, b"another-id" if k == "ce_id" else v) for k, v in sent.headers]
    echoes.expect(resolution)
    assert echoes.take(Consumed("log", 2, 40, b"wf", sent.value, headers)) is None
    echoes.expect(resolution)
    assert echoes.take(Consumed("log", 2, 40, b"wf", sent.value, [])) is None


def test_echoes_never_read_back_are_bounded() -> None:
    echoes, resolution = Echoes("log", size=3), _decided()
    event = resolution.events[0]
    for offset in range(10):
        echoes.expect(
            Resolution(resolution.step, resolution.action, (event,), (Position("log", 2, offset),))
        )
    assert echoes.take(_record(resolution, offset=0)) is None
    assert echoes.take(_record(resolution, offset=9)) is event

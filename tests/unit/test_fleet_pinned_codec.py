"""A fleet role's codec refuses an event that claims another fleet: the one decode every
reader of the fleet goes through (projector, recovery daemon, history) says so."""

from __future__ import annotations

import pytest

import stepledger as sl
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.factory import EventFactory
from stepledger.errors import ForeignFleetError
from stepledger.log import codec_for
from stepledger.projector.engine import FOREIGN_FLEET_STAGE, stage_of


@sl.tool(keyed=True, timeout_s=5)
def noop(n: int, *, idempotency_key: str) -> int:
    return n


def _value(fleet: str) -> bytes:
    return Codec().encode(EventFactory(fleet, "agent").intent("w", "s", noop, {"n": 1}, sequence=0))


def test_a_fleet_roles_codec_refuses_another_fleets_event_and_reads_its_own() -> None:
    pinned = codec_for(Settings(bootstrap="h:1", topic="fb", fleet_id="fb", role="projector"))
    assert pinned.decode(_value("fb")).fleet_id == "fb"
    claim = "claims fleet 'fa' in the step log of fleet 'fb'"
    with pytest.raises(ForeignFleetError, match=claim) as refused:
        pinned.decode(_value("fa"))
    assert stage_of(refused.value) == FOREIGN_FLEET_STAGE == "fleet"


def test_settings_without_a_fleet_role_read_every_fleets_events() -> None:
    """An open deployment (no role config) keeps fleet_id a tag: one log, many fleet ids."""
    shared = codec_for(Settings(bootstrap="h:1", topic="log", fleet_id="fb"))
    assert shared.decode(_value("fa")).fleet_id == "fa"

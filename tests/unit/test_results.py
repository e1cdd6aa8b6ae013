"""Results that round-trip: a replayed step returns a value equal to, and of the type of, the first.

Each supported kind of result is returned by a tool in a first "process", then the same
workflow is resumed by a new ledger over the same log and the step is replayed from it.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from stepledger.domain.ids import canonical_digest, canonical_json
from stepledger.domain.tools import Tool
from stepledger.errors import ResultTypeError, ToolDefinitionError
from tests.unit.resume_fakes import World


class Receipt(BaseModel):
    charge_id: str
    amount: Decimal
    at: datetime


@dataclass(frozen=True)
class Booking:
    booking_id: str
    night: date
    nights: int
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Nested:
    booking: Booking
    receipts: list[Receipt]


class Opaque:
    """A handle pydantic has no schema for: it cannot be recorded and replayed."""

    def __init__(self, handle: object) -> None:
        self.handle = handle


class Colour(enum.Enum):
    RED = "red"


AT = datetime(2026, 1, 1, 12, 30, 15, 123456, tzinfo=UTC)
RECEIPT = Receipt(charge_id="ch_1", amount=Decimal("12.50"), at=AT)
BOOKING = Booking("bk_1", date(2026, 1, 1), 2, ("sea", "view"))

CASES: list[tuple[str, Any, Any]] = [
    ("json-object", {"a": [1, 2.5, "x", None, True]}, None),
    ("json-list", [1, "two", {"three": 3}], None),
    ("json-str", "2026-01-01", None),
    ("json-int", 42, None),
    ("json-float", 2.5, None),
    ("json-bool", False, None),
    ("pydantic-model", RECEIPT, Receipt),
    ("dataclass", BOOKING, Booking),
    ("nested", Nested(BOOKING, [RECEIPT]), Nested),
    ("datetime", AT, datetime),
    ("date", date(2026, 1, 1), date),
    ("decimal", Decimal("0.10"), Decimal),
    ("uuid", uuid.UUID(int=7), uuid.UUID),
    ("enum", Colour.RED, Colour),
    ("tuple", (1, "a"), tuple[int, str]),
    ("list-of-models", [RECEIPT, RECEIPT], list[Receipt]),
]


def replay_twice(tool: Tool, value: Any) -> tuple[Any, Any, World]:
    world = World()
    first = world.ledger().workflow("wf").step("s", tool, {"n": 1}, lambda a, k: value)
    replayed = world.ledger().workflow("wf").step("s", tool, {"n": 1}, lambda a, k: "called!")
    return first, replayed, world


@pytest.mark.parametrize("name,value,declared", CASES, ids=[c[0] for c in CASES])
def test_a_replayed_result_is_equal_and_of_the_same_type(
    name: str, value: Any, declared: Any
) -> None:
    tool = Tool(name="t", keyed=True, result_type=declared)
    first, replayed, _ = replay_twice(tool, value)
    assert first is value
    assert replayed == value and type(replayed) is type(value)
    if isinstance(value, Nested):
        assert type(replayed.receipts[0]) is Receipt and type(replayed.booking.night) is date


def test_the_result_type_comes_from_the_functions_return_annotation() -> None:
    def book(args: dict[str, Any], key: str) -> Booking:
        return BOOKING

    tool = Tool(name="book", keyed=True, run=book)
    world = World()
    assert world.ledger().workflow("wf").step("s", tool, {}) == BOOKING
    replayed = world.ledger().workflow("wf").step("s", tool, {})
    assert replayed == BOOKING and type(replayed) is Booking
    assert tool.results.name.endswith("Booking")


def test_a_result_type_that_cannot_round_trip_is_refused_when_the_tool_is_defined() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be recorded and replayed"):
        Tool(name="t", keyed=True, result_type=Opaque)

    def run(args: dict[str, Any], key: str) -> Opaque:
        return Opaque(object())

    with pytest.raises(ResultTypeError):
        Tool(name="u", keyed=True, run=run)

    class Local:
        pass

    def local(args: dict[str, Any], key: str) -> Local:
        return Local()

    with pytest.raises(ToolDefinitionError, match="cannot be resolved"):
        Tool(name="v", keyed=True, run=local)


def test_an_undeclared_result_that_is_not_json_is_never_silently_changed() -> None:
    tool = Tool(name="t", keyed=True)  # no declared type: results must be JSON values
    world = World()
    wf = world.ledger().workflow("wf")
    with pytest.raises(ResultTypeError, match="declare result_type"):
        wf.step("s", tool, {}, lambda a, k: BOOKING)
    assert wf.state.steps["s"].status.value == "succeeded", "the effect is recorded"
    with pytest.raises(ResultTypeError, match="cannot be replayed"):
        world.ledger().workflow("wf").step("s", tool, {}, lambda a, k: BOOKING)


def test_a_value_that_would_come_back_as_another_type_is_refused() -> None:
    tool = Tool(name="t", keyed=True, result_type=str | date)
    world = World()
    with pytest.raises(ResultTypeError, match="would come back as str"):
        world.ledger().workflow("wf").step("s", tool, {}, lambda a, k: date(2026, 1, 1))


def test_a_replay_under_another_declared_type_raises() -> None:
    world = World()
    first = Tool(name="t", keyed=True, result_type=Booking)
    world.ledger().workflow("wf").step("s", first, {}, lambda a, k: BOOKING)
    changed = Tool(name="t", keyed=True, result_type=Receipt)
    with pytest.raises(ResultTypeError, match="now returns"):
        world.ledger().workflow("wf").step("s", changed, {}, lambda a, k: RECEIPT)


def test_the_fingerprint_tells_a_date_from_its_text() -> None:
    tool = Tool(name="t", keyed=True)

    def fp(arguments: dict[str, Any]) -> str:
        return tool.fingerprint(arguments, workflow_id="wf", step_id="s")

    assert fp({"day": "2026-01-01"}) != fp({"day": date(2026, 1, 1)})
    assert fp({"amounts": (1, 2)}) != fp({"amounts": [1, 2]})
    plain = {"amount": 5, "tags": ["a"], "note": None}
    assert tool.legacy_digest(plain) == canonical_digest(canonical_json(plain)), (
        "the digest intents recorded before fingerprints, which a resume still accepts"
    )


@pytest.mark.parametrize(
    ("declared", "value"),
    [
        (int, 7),
        (int, 10**30),
        (int, True),
        (bool, True),
        (float, 1.5),
        (float, 1e308),
        (float, float("nan")),
        (float, float("inf")),
        (float, 3),
        (str, "é\u2028"),
        (str, ""),
        pytest.param(str, "\ud800", id="lone-surrogate"),
        pytest.param(int, 10**5000, id="int-of-5001-digits"),
    ],
)
def test_a_scalar_result_is_encoded_as_the_pydantic_round_trip_would_encode_it(
    declared: type, value: Any
) -> None:
    """Results of exactly a declared str/int/bool/finite float skip the round trip."""
    from pydantic import TypeAdapter

    from stepledger.domain.results import ResultCodec

    encoded = ResultCodec(declared).encode(value)
    adapter: TypeAdapter[Any] = TypeAdapter(declared)
    dumped = adapter.dump_python(value, mode="json")
    try:
        back = adapter.validate_json(canonical_json(dumped))
    except ValueError as exc:  # the round trip refuses it (pydantic's errors are ValueErrors)
        back = exc
    same = type(back) is type(value) and back == value
    assert (encoded.problem is None) == same, (encoded, back)
    if same:
        assert encoded.value == dumped and type(encoded.value) is type(dumped)

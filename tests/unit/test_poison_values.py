"""Values past their type's range: refused where events are built, dead-lettered where projected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from stepledger.codec import Codec
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.domain import events as ev
from stepledger.domain.state import StepState, WorkflowState
from stepledger.errors import EventValidationError
from stepledger.projector.engine import PROJECT_STAGE, Projector
from stepledger.projector.pipeline import Pipeline
from stepledger.projector.rows import STEP_INT32, WORKFLOW_INT32
from stepledger.projector.schema import ARROW
from stepledger.projector.store import ProjectionStore
from tests.fuzz_events import encode_unchecked, overflowing_clearance, with_body
from tests.unit.factories import factory
from tests.unit.projector_harness import record, table_contents, to_messages
from tests.unit.projector_logs import TOOLS

CODEC = Codec()
PAST = [2**31, -(2**31) - 1, 2**63]


@pytest.mark.parametrize("value", PAST)
@pytest.mark.parametrize(
    ("model", "field", "valid"),
    [
        (ev.WorkflowStarted, "attempt", {"read_only": False}),
        (ev.WorkflowStarted, "max_attempts", {"attempt": 1, "read_only": False}),
        (ev.WorkflowResumed, "attempt", {}),
        (ev.StepOutcome, "attempt", {"status": "succeeded", "source": "agent"}),
        (ev.ResolutionAttempted, "attempt", {"policy": "query"}),
        (ev.WorkflowDeadLettered, "attempt", {"reason": "r", "escalation_id": "e"}),
    ],
)
def test_an_integer_its_avro_type_cannot_hold_is_refused_where_the_event_is_built(
    model: type[Any], field: str, valid: dict[str, Any], value: int
) -> None:
    with pytest.raises(ValidationError):
        model(**valid, **{field: value})


def test_the_sequence_of_an_intent_is_bounded_too() -> None:
    intent = factory().intent("w", "s", TOOLS[0], {}, sequence=0)
    with pytest.raises(ValidationError):
        ev.StepIntended(**{**intent.body.model_dump(), "sequence": 2**31})


def test_a_foreign_out_of_range_int_on_the_wire_is_an_invalid_event() -> None:
    intent = factory().intent("w", "s", TOOLS[0], {}, sequence=0)
    raw = encode_unchecked(with_body(intent, attempt=2**31))
    with pytest.raises(EventValidationError, match="attempt"):
        CODEC.decode(raw)


def test_the_state_attributes_checked_are_the_32_bit_columns() -> None:
    def int32(table: str, attrs: type[Any]) -> set[str]:
        names = {f.name for f in ARROW[table] if f.type == pa.int32()}
        fields = attrs.__dataclass_fields__
        return {n for n in names if n in fields and fields[n].type in ("int", int)}

    assert int32("steps", StepState) == set(STEP_INT32)
    assert int32("workflows", WorkflowState) == set(WORKFLOW_INT32)


@pytest.mark.parametrize("largest", [1, 3, 1000])
def test_an_event_whose_rows_cannot_be_staged_is_dead_lettered_and_the_rest_projects(
    tmp_path: Path, largest: int
) -> None:
    f = factory()
    good_before = [f.workflow_started("ok", name="", attempt=1, read_only=False, max_attempts=2)]
    bad = overflowing_clearance(f, "big")
    good_after = [f.intent("ok", "s", TOOLS[0], {}, sequence=0)]
    messages = to_messages([*good_before, *bad, *good_after], partitions=1)
    # A foreign producer's value whose attempt only fastavro would write.
    raw = encode_unchecked(with_body(good_after[0], attempt=2**31))
    messages.insert(2, record("log", 0, 99, raw))
    messages[3:] = [record("log", 0, 100 + i, m.value) for i, m in enumerate(messages[3:])]
    letters = MemoryRecordLetters()
    db = tmp_path / f"p{largest}.duckdb"
    with ProjectionStore(db) as store:
        pipeline = Pipeline(Projector(store, CODEC, letters))
        for i in range(0, len(messages), largest):
            pipeline.feed(messages[i : i + largest])
        pipeline.close()
    stages = sorted(x.stage for x in letters.letters)
    assert stages == [PROJECT_STAGE, "validate"]
    refused = next(x for x in letters.letters if x.stage == PROJECT_STAGE)
    assert CODEC.decode(refused.value).type == "escalation_resolved"
    assert "max_attempts" in refused.error
    tables = table_contents(db)
    assert len(tables["events"]) == 4  # both good events and the two valid "big" ones
    assert {row[0] for row in tables["workflows"]} == {"ok", "big"}
    last = messages[-1].offset
    assert last is not None
    assert [r[-1] for r in tables["offsets"]] == [last + 1]

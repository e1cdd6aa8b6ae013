"""The contract only evolves backward-compatibly: every released version stays readable."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from stepledger.codec import (
    ENVELOPE,
    SINGLE_OBJECT_MAGIC,
    Codec,
    load_envelope_schema,
    single_object_fingerprint,
    to_record,
)
from stepledger.domain.events import Event, StepIntended
from tests.unit.test_codec import sample_events

ROOT = Path(__file__).resolve().parents[2] / "schemas"
RELEASED = sorted(p for p in (ROOT / "released").iterdir() if p.is_dir())


def named_types(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in directory.glob("*.avsc")}


def compatibility_problems(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]
) -> list[str]:
    """Why data written with ``old`` might not be readable with ``new`` (empty: it is)."""
    problems = []
    for name, before in old.items():
        after = new.get(name)
        if after is None:
            problems.append(f"{name} was removed")
        elif before["type"] == "enum":
            if after["symbols"][: len(before["symbols"])] != before["symbols"]:
                problems.append(f"{name}: symbols may only be appended")
        else:
            problems += _record_problems(name, before, after)
    return problems


def _record_problems(name: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    old_fields = {f["name"]: f for f in before["fields"]}
    new_fields = {f["name"]: f for f in after["fields"]}
    problems = []
    for field, spec in new_fields.items():
        if field not in old_fields and "default" not in spec:
            problems.append(f"{name}.{field} was added without a default")
    for field, spec in old_fields.items():
        if field in new_fields and new_fields[field]["type"] != spec["type"]:
            old_type, new_type = spec["type"], new_fields[field]["type"]
            if not (isinstance(old_type, list) and new_type[: len(old_type)] == old_type):
                problems.append(f"{name}.{field} changed type")
    return problems


def test_there_is_a_released_baseline() -> None:
    assert RELEASED, "schemas/released/ must hold at least the first release"


@pytest.mark.parametrize("release", RELEASED, ids=lambda p: p.name)
def test_current_contract_is_backward_compatible_with(release: Path) -> None:
    assert compatibility_problems(named_types(release), named_types(ROOT)) == []


@pytest.mark.parametrize("release", RELEASED, ids=lambda p: p.name)
def test_events_written_with_a_released_schema_decode(release: Path) -> None:
    old = load_envelope_schema(release)
    codec = Codec()  # knows every released writer schema without being told
    for event in sample_events():
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, old, to_record(event))
        data = SINGLE_OBJECT_MAGIC + single_object_fingerprint(old) + buf.getvalue()
        assert codec.decode(data) == as_written_by(release, event)


def as_written_by(release: Path, event: Event) -> Event:
    """The event as a producer on ``release`` wrote it: fields added since take their defaults."""
    body = event.body
    name = f"stepledger.{type(body).__name__}"
    known = {f["name"] for f in named_types(release)[name]["fields"]}
    added = {
        field: info.default
        for field, info in type(body).model_fields.items()
        if field != "type" and field not in known
    }
    return event.model_copy(update={"body": body.model_copy(update=added)})


def test_an_intent_written_before_the_two_properties_is_judged_by_its_class() -> None:
    """0.1.0 intents carry no repeatable/undoable: the fold derives them from effect and policy."""
    from stepledger.domain.state import replay

    intent = sample_events()[1]
    old = as_written_by(RELEASED[0], intent)
    assert isinstance(old.body, StepIntended) and old.body.repeatable is None
    step = replay("wf", [old]).steps["s1"]
    assert step.repeatable and not step.undoable and not step.after_pivot


def test_the_check_catches_an_incompatible_change() -> None:
    old = named_types(RELEASED[-1])
    new = json.loads(json.dumps(old))
    new["stepledger.StepOutcome"]["fields"].append({"name": "cost", "type": "int"})
    new["stepledger.OutcomeStatus"]["symbols"].insert(0, "maybe")
    del new["stepledger.AnomalyObserved"]
    problems = compatibility_problems(old, new)
    assert len(problems) == 3, problems
    assert ENVELOPE in named_types(ROOT)

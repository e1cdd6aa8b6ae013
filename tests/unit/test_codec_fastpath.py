"""The codec's cheap path builds exactly what pydantic builds, and leaves everything else to it.

Every field of every event type is given values at and past its range, of the wrong type,
empty, naive or off-millisecond; keys are dropped and added.  Whenever the cheap path
builds an event, pydantic must accept the same record and build an equal one (same values,
same fields set, same dump); whenever pydantic refuses, the cheap path must have declined.
"""

from __future__ import annotations

import copy
import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import fastavro
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stepledger._records import EventPlans, plan_for
from stepledger.codec import _BODY_BY_NAME, Codec, from_record
from stepledger.domain import events as ev
from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
    WorkflowStatus,
)
from stepledger.errors import EventValidationError

AT = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
BODIES: list[BaseModel] = [
    ev.WorkflowStarted(name="n", attempt=1, read_only=False, max_attempts=3),
    ev.WorkflowResumed(attempt=2, reason="crash"),
    ev.WorkflowFinished(status=WorkflowStatus.COMPLETED, detail="d", escalation_id="e"),
    ev.WorkflowDeadLettered(attempt=6, reason="r", escalation_id="e"),
    ev.StepIntended(
        sequence=0,
        tool="pay",
        effect=EffectClass.IDEMPOTENT,
        policy=ResolutionPolicy.QUERY,
        idempotency_key="k",
        arguments_json="{}",
        arguments_digest="d",
        deadline=AT,
        attempt=1,
        repeatable=True,
    ),
    ev.StepOutcome(status=OutcomeStatus.SUCCEEDED, result_json="{}", source=Source.AGENT),
    ev.CompensationIntended(idempotency_key="k:c", reason="r", source=Source.AGENT, deadline=AT),
    ev.CompensationOutcome(status=CompensationStatus.FAILED, error="x", source=Source.AGENT),
    ev.StepAbandoned(reason="r", escalation_id="e", source=Source.RECOVERY),
    ev.ResolutionAttempted(policy=ResolutionPolicy.REDRIVE, attempt=2),
    ev.EscalationResolved(escalation_id="e", verdict=Verdict.HAPPENED, by="ann"),
    ev.ApprovalRequested(tool="pay"),
    ev.ApprovalDecided(granted=True, by="ann"),
    ev.AnomalyObserved(kind="k", detail="d", source=Source.RECONCILE),
]
PLUS_TWO = timezone(timedelta(hours=2))
HOSTILE: list[Any] = [
    "",
    "x",
    None,
    0,
    -1,
    1,
    2.0,
    True,
    False,
    b"x",
    ev.INT32_MIN - 1,
    ev.INT32_MIN,
    ev.INT32_MAX,
    ev.INT32_MAX + 1,
    ev.INT64_MIN - 1,
    ev.INT64_MAX,
    ev.INT64_MAX + 1,
    "nope",
    "succeeded",
    "agent",
    "query",
    "idempotent",
    AT,
    AT.replace(tzinfo=None),
    AT.replace(microsecond=123456),
    AT.astimezone(PLUS_TWO),
    datetime(1, 1, 1, tzinfo=UTC),
    {"nested": 1},
]


def decoded_records() -> list[dict[str, Any]]:
    """Each body type in an envelope, encoded and read back by fastavro as the codec reads it."""
    codec = Codec()
    out = []
    for i, body in enumerate(BODIES):
        event = ev.Event(
            event_id=f"e{i}",
            workflow_id="wf",
            step_id="s1" if i % 2 else None,
            fleet_id="f",
            producer_id="p",
            occurred_at=AT,
            body=body,  # type: ignore[arg-type]
        )
        data = codec.encode(event)
        record = fastavro.schemaless_reader(
            io.BytesIO(data[10:]), codec.schema, None, return_record_name=True
        )
        assert isinstance(record, dict)
        out.append(record)
    return out


def pydantic_event(record: dict[str, Any]) -> ev.Event:
    """What the codec built before the cheap path: pydantic alone."""
    name, body = record["body"]
    kind = _BODY_BY_NAME[name].model_fields["type"].default
    return ev.Event.model_validate({**record, "body": {**body, "type": kind}})


def assert_same(fast: ev.Event, slow: ev.Event) -> None:
    assert type(fast.body) is type(slow.body)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert list(fast.__dict__) == list(slow.__dict__)
    assert list(fast.body.__dict__) == list(slow.body.__dict__)
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.body.model_fields_set == slow.body.model_fields_set
    assert fast.__pydantic_extra__ is None and fast.__pydantic_private__ is None
    assert hash(fast.event_id) == hash(slow.event_id)


def mutations(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record with each envelope and body field replaced, dropped, or a key added."""
    name, body = record["body"]
    out = []
    for key in [k for k in record if k != "body"]:
        for value in HOSTILE:
            out.append({**record, key: value})
        out.append({k: v for k, v in record.items() if k != key})
    for key in body:
        for value in HOSTILE:
            out.append({**record, "body": (name, {**body, key: value})})
        out.append({**record, "body": (name, {k: v for k, v in body.items() if k != key})})
    out.append({**record, "extra": 1})
    out.append({**record, "body": (name, {**body, "extra": 1})})
    return out


def test_every_model_has_a_plan() -> None:
    # Without a plan the cheap path silently does nothing: every event type must have one.
    plans = EventPlans(_BODY_BY_NAME)
    assert plans.envelope is not None
    assert all(plan is not None for plan in plans.bodies.values())
    assert set(plans.bodies) == set(_BODY_BY_NAME)


def test_valid_records_take_the_cheap_path_and_match_pydantic() -> None:
    plans = EventPlans(_BODY_BY_NAME)
    for record in decoded_records():
        fast = plans.build(copy.deepcopy(record))
        assert fast is not None, record["body"][0]
        assert_same(fast, pydantic_event(record))


def test_hostile_values_are_built_only_where_pydantic_agrees() -> None:
    plans = EventPlans(_BODY_BY_NAME)
    built = refused = 0
    for original in decoded_records():
        for record in mutations(original):
            fast = plans.build(record)
            try:
                slow = pydantic_event(record)
            except ValidationError:
                assert fast is None, record
                refused += 1
                continue
            if fast is not None:
                assert_same(fast, slow)
                built += 1
    # Both outcomes must have been exercised many times for the comparison to mean anything.
    assert built > 300 and refused > 1000, (built, refused)


def test_from_record_still_names_the_invalid_field() -> None:
    record = decoded_records()[4]  # a step intent
    name, body = record["body"]
    bad = {**record, "body": (name, {**body, "attempt": 0})}
    with pytest.raises(EventValidationError, match="attempt"):
        from_record(bad)
    assert_same(from_record(record), pydantic_event(record))


def test_built_events_share_their_fields_set_but_a_copy_changes_its_own() -> None:
    # Every event a plan builds shares one fields set per model: pydantic copies it before
    # a copy changes it, so no change to one event reaches another.
    plans = EventPlans(_BODY_BY_NAME)
    first, second = (plans.build(copy.deepcopy(r)) for r in decoded_records()[4:6])
    assert first is not None and second is not None
    copied = first.model_copy(update={"step_id": "other"})
    assert copied.step_id == "other" and copied.model_fields_set is not first.model_fields_set
    assert first.model_fields_set == second.model_fields_set == set(ev.Event.model_fields)
    assert first.model_fields_set is second.model_fields_set


class _Pattern(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    code: str = Field(pattern="^[a-z]+$")


class _Validated(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    n: int

    @model_validator(mode="after")
    def _check(self) -> _Validated:
        return self


class _Loose(BaseModel):
    model_config = ConfigDict(frozen=True)
    n: int


class _Float(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    x: float


@pytest.mark.parametrize("model", [_Pattern, _Validated, _Loose, _Float])
def test_a_model_outside_the_plan_gets_none(model: type[BaseModel]) -> None:
    # A constraint, validator, setting or type the plan does not know leaves it to pydantic.
    assert plan_for(model) is None

"""The SDK's per-step fast path builds events without pydantic: they must be what the
strict model would build.  Each event is encoded, decoded with the strict validator
(``Codec.decode`` -> ``Event.model_validate``) and compared; the shortcuts (one canonical
pass, ``to_record`` from fields, the fold's saga indexes) are checked against the long way.
"""

from __future__ import annotations

import datetime as dt
import enum
import random
from typing import Any

import pytest

from stepledger.codec import Codec, to_record
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.fingerprint import of_text
from stepledger.domain.ids import canonical_json, plain_json, typed_canonical_json
from stepledger.domain.saga import pivot_passed, step_violations
from stepledger.domain.secrets import RedactionKey, Scrubber
from stepledger.domain.state import WorkflowState, replay
from stepledger.domain.tools import Tool
from stepledger.errors import EventValidationError
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger
from tests.fuzz_events import EventFuzzer

KEYED = Tool(name="charge", keyed=True)
SECRET = Tool(name="pay", policy="escalate", secret_args=frozenset({"card", "cards[].cvv"}))
UNDO = Tool(name="book", compensate=lambda a, k, r: None)


class Colour(enum.StrEnum):
    RED = "red"


ARGUMENTS: list[dict[str, Any]] = [
    {},
    {"amount": 1250, "currency": "EUR", "memo": "x" * 120},
    {"nested": {"list": [1, 2.5, None, True, "é"]}, "empty": {}},
    {"when": dt.date(2026, 1, 1)},
    {"pair": (1, 2)},
    {"colour": Colour.RED},
    {"keys": {1: "int key"}},
    {"card": "4242 4242 4242 4242", "cards": [{"cvv": "123", "n": 1}]},
    {"huge": "y" * 200_000},
]


def _strict(codec: Codec, event: ev.Event) -> ev.Event:
    """The event as a consumer sees it: encoded, decoded and validated by the strict model."""
    return codec.decode(codec.encode(event))


@pytest.mark.parametrize("arguments", ARGUMENTS)
@pytest.mark.parametrize("tool", [KEYED, SECRET, UNDO])
@pytest.mark.parametrize("key", [None, RedactionKey("k" * 16)])
def test_fast_intent_is_the_strict_event(
    arguments: dict[str, Any], tool: Tool, key: RedactionKey | None
) -> None:
    factory = EventFactory("fleet", "producer", redaction_key=key)
    event = factory.intent("wf", "s1", tool, arguments, sequence=7, attempt=3, after_pivot=True)
    codec = Codec()
    assert _strict(codec, event) == event
    assert ev.Event.model_validate(event.model_dump()) == event
    body = event.body
    assert isinstance(body, ev.StepIntended)
    # The one-pass arguments are what the two separate passes give.
    redacted = tool.redact(arguments, key, workflow_id="wf", step_id="s1")
    assert body.arguments_json == canonical_json(redacted)
    # The one-pass fingerprint is the typed description's (every argument identifies).
    assert body.arguments_digest == of_text(tool.name, "s1", typed_canonical_json(redacted))
    assert body.deadline == event.occurred_at + dt.timedelta(seconds=tool.timeout_s)


@pytest.mark.parametrize(
    ("result", "error"),
    [(None, None), ({"ok": True}, None), (None, ValueError("card 4242 refused")), ([1], "x")],
)
def test_fast_outcome_is_the_strict_event(result: Any, error: Any) -> None:
    factory, codec = EventFactory("fleet", "producer"), Codec()
    scrub = Scrubber(("4242",))
    for status in OutcomeStatus:
        event = factory.outcome(
            "wf",
            "s1",
            attempt=2,
            status=status,
            source=Source.RECOVERY,
            result=result,
            error=error,
            evidence={"found": 1},
            scrub=scrub,
            result_type="json",
        )
        assert _strict(codec, event) == event
        assert ev.Event.model_validate(event.model_dump()) == event
        assert "4242" not in codec.encode(event).decode("utf-8", "replace")


def test_every_event_the_sdk_appends_passes_the_strict_validator() -> None:
    log = InMemoryEventLog()
    ledger = Ledger(log=log, tools=[KEYED, UNDO])
    wf = ledger.start("wf-sdk")
    wf.step("a", UNDO, {"n": 1}, fn=lambda a, k: {"booked": a["n"]})
    wf.step("b", KEYED, {"n": 2}, fn=lambda a, k: None)
    with pytest.raises(ValueError, match="boom"):
        wf.step("c", KEYED, {"n": 3}, fn=_boom)
    wf.finish()
    codec = Codec()
    assert len(log.events) == 8
    for event in log.events:
        assert _strict(codec, event) == event


def _boom(arguments: dict[str, Any], key: str) -> None:
    raise ValueError("boom")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"sequence": 2**31}, "sequence"),
        ({"sequence": -1}, "sequence"),
        ({"attempt": 0}, "attempt"),
        ({"attempt": 2**31}, "attempt"),
        ({"attempt": True}, "attempt"),
        ({"step_id": 5}, "step id"),
        ({"workflow_id": ""}, "workflow id"),
    ],
)
def test_values_past_their_range_are_refused_where_the_event_is_built(
    call: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"workflow_id": "wf", "step_id": "s", "sequence": 0, "attempt": 1}
    args.update(call)
    with pytest.raises(EventValidationError, match=message):
        EventFactory("f", "p").intent(
            args["workflow_id"],
            args["step_id"],
            KEYED,
            {},
            sequence=args["sequence"],
            attempt=args["attempt"],
        )


def test_a_factory_refuses_empty_producer_ids() -> None:
    with pytest.raises(EventValidationError, match="producer_id"):
        EventFactory("fleet", "")


@pytest.fixture(scope="module")
def fuzzed() -> list[ev.Event]:
    """Valid events of every kind, drawn from the contract (seeded)."""
    codec = Codec()
    events = []
    for value in EventFuzzer(14, codec=codec, huge=0).values(300):
        try:
            events.append(codec.decode(value))
        except Exception:
            continue
    return events


def test_to_record_is_the_model_dump_record_for_every_event_kind(fuzzed: list[ev.Event]) -> None:
    events = fuzzed
    assert len({e.type for e in events}) >= 10
    for event in events:
        record = event.model_dump()
        body = record["body"]
        name = f"stepledger.{type(event.body).__name__}"
        assert body.pop("type") == event.type
        assert to_record(event) == {**record, "body": (name, body)}


def test_plain_json_answers_as_the_typed_text_does() -> None:
    for value in [*ARGUMENTS, [1, [2, {"a": None}]], 1.5, None, "s", {"t": (1,)}, {1, 2}]:
        if plain_json(value):
            assert typed_canonical_json(value) == canonical_json(value)
    assert not plain_json({"when": dt.date(2026, 1, 1)})
    assert not plain_json({"pair": (1, 2)})


def test_saga_counts_stay_those_of_a_full_pass(fuzzed: list[ev.Event]) -> None:
    rng = random.Random(14)
    by_workflow: dict[str, list[ev.Event]] = {}
    for event in fuzzed:
        by_workflow.setdefault(event.workflow_id, []).append(event)
    for wf_events in by_workflow.values():
        rng.shuffle(wf_events)
        state = replay(wf_events[0].workflow_id, wf_events)
        assert state.pivots_happened == sum(s.pivot_happened for s in state.steps.values())
        assert state.unresolved_undoable == sum(s.unresolved_undoable for s in state.steps.values())
        again = WorkflowState(state.workflow_id, steps=dict(state.steps))
        assert again.pivots_happened == state.pivots_happened


def test_a_step_call_costs_no_pass_over_the_workflows_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = Ledger(log=InMemoryEventLog())
    wf = ledger.start("wf-long")
    for i in range(50):
        wf.step(f"s{i}", KEYED, {"i": i}, fn=lambda a, k: None)

    def full_pass(self: WorkflowState) -> list[Any]:
        raise AssertionError("a step call sorted every step of the workflow")

    monkeypatch.setattr(WorkflowState, "ordered_steps", full_pass)
    wf.step("last", KEYED, {"i": 50}, fn=lambda a, k: None)
    assert wf.state.steps["last"].after_pivot
    # The rules still name with the steps in workflow order when a rule is broken.
    monkeypatch.undo()
    assert [s.step_id for s in pivot_passed(wf.state, "last")][:3] == ["s0", "s1", "s2"]
    found = step_violations(wf.state, "undo", UNDO)
    assert [v.kind.value for v in found] == ["pivot_passed"]

"""An approval binds the exact call it showed (in memory): other arguments ask again.

The attack from the issue: a pivot asks approval for 100 to acct-A, the agent dies, a
person approves, the resumed agent calls the same step with 9,000 to acct-B.  It must
never run under the old approval.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.secrets import RedactionKey
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import ApprovalMismatchError, ApprovalPendingError, ToolDefinitionError
from stepledger.history.memory import InMemoryHistory
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger, approval
from tests.unit.resume_fakes import World

HUMAN = EventFactory("fleet", "inbox")
KEY = "operator-secret-0123456789"


def keyed_world() -> World:
    """A world whose ledgers have a redaction key: the wire's pin is secret."""
    return World(redaction_key=KEY)


class Bank:
    """Counts the wires actually sent."""

    def __init__(self) -> None:
        self.wires: list[dict[str, Any]] = []

    def wire(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        self.wires.append(dict(args))
        return {"wire": key}

    def tool(self, **extra: Any) -> Tool:
        return Tool(
            name="wire",
            effect="irreversible",
            requires_approval=True,
            secret_args=frozenset({"pin"}),
            run=self.wire,
            **extra,
        )


HOLD = Tool(
    name="hold",
    effect="compensatable",
    run=lambda a, k: {"hold": k},
    compensate=lambda a, k, r: None,
)


def ask(ledger: Ledger, tool: Tool, **args: Any) -> Any:
    wf = ledger.workflow("wf")
    wf.step("hold", HOLD, nights=2)
    return wf.step("wire", tool, args)


def requests(world: World) -> list[ev.ApprovalRequested]:
    return [e.body for e in world.log.events if isinstance(e.body, ev.ApprovalRequested)]


def decide(world: World, granted: bool = True, digest: str | None = None) -> ev.Event:
    reader = InMemoryHistory(world.log)
    human = EventFactory("fleet", "inbox", clock=world.clock)
    return approval.decide(
        world.log, human, reader, "wf", "wire", granted=granted, by="alice", digest=digest
    )


def test_the_request_shows_the_call_redacted_its_digest_and_the_saga() -> None:
    world, bank = keyed_world(), Bank()
    tool = bank.tool(approval_valid_for=600)
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=100, to="acct-A", pin="4321")
    (shown,) = requests(world)
    arguments = json.loads(shown.arguments_json or "")
    assert arguments["amount"] == 100 and arguments["to"] == "acct-A"
    assert "4321" not in (shown.arguments_json or "") and arguments["pin"] != "4321"
    key = RedactionKey(KEY)
    call = {"amount": 100, "to": "acct-A", "pin": "4321"}
    assert shown.arguments_digest == tool.fingerprint(
        call, workflow_id="wf", step_id="wire", key=key
    )
    saga = json.loads(shown.saga_json or "")
    assert [s["step_id"] for s in saga["happened"]] == ["hold"]
    assert [s["step_id"] for s in saga["undone_if_denied"]] == ["hold"]
    assert saga["standing_if_denied"] == []
    assert (shown.valid_for_s, shown.request) == (600, 1)
    decided = decide(world)
    assert isinstance(decided.body, ev.ApprovalDecided)
    assert decided.body.arguments_digest == shown.arguments_digest


def test_approved_100_to_a_resumed_with_9000_to_b_wires_nothing_and_asks_again() -> None:
    world, bank = keyed_world(), Bank()
    tool = bank.tool()
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=100, to="acct-A")
    decide(world)
    with pytest.raises(ApprovalPendingError, match="awaits approval"):
        ask(world.ledger(), tool, amount=9000, to="acct-B")
    assert bank.wires == []
    first, second = requests(world)
    assert second.request == 2 and json.loads(second.arguments_json or "")["to"] == "acct-B"
    assert second.reason is not None and "differs from the one approved" in second.reason
    # A person who looked at the first request is refused; nothing is appended.
    with pytest.raises(ApprovalMismatchError, match="asked again with other arguments"):
        decide(world, digest=first.arguments_digest)
    # An answer naming the old call that reaches the log anyway is not applied.
    stale = ev.ApprovalDecided(granted=True, by="eve", arguments_digest=first.arguments_digest)
    world.log.append(HUMAN.envelope("wf", "wire", stale))
    state = replay("wf", world.log.events)
    assert state.steps["wire"].status is StepStatus.AWAITING_APPROVAL
    assert [a.kind for a in state.anomalies] == ["stale_approval"]
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=9000, to="acct-B")
    assert bank.wires == [] and len(requests(world)) == 2  # the same call: no third request
    decide(world, digest=(second.arguments_digest or "")[:12])
    ask(world.ledger(), tool, amount=9000, to="acct-B")
    assert bank.wires == [{"amount": 9000, "to": "acct-B"}]


def test_approved_and_resumed_with_the_same_arguments_wires_once() -> None:
    world, bank = keyed_world(), Bank()
    tool = bank.tool()
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=100, to="acct-A")
    decide(world)
    assert ask(world.ledger(), tool, amount=100, to="acct-A") == {"wire": bank_key(world)}
    ask(world.ledger(), tool, amount=100, to="acct-A")  # replayed, not called
    assert bank.wires == [{"amount": 100, "to": "acct-A"}]
    assert len(requests(world)) == 1


def bank_key(world: World) -> str:
    intent = next(
        e.body
        for e in world.log.events
        if isinstance(e.body, ev.StepIntended) and e.step_id == "wire"
    )
    return intent.idempotency_key


def test_an_expired_approval_asks_again() -> None:
    world, bank = keyed_world(), Bank()
    tool = bank.tool(approval_valid_for=30)  # each World ledger comes 60 s later
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=100, to="acct-A")
    decide(world)
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), tool, amount=100, to="acct-A")
    assert bank.wires == []
    again = requests(world)[-1]
    assert again.request == 2 and again.reason is not None and "expired" in again.reason
    decide(world)
    long_lived = bank.tool(approval_valid_for=3600)
    ask(world.ledger(), long_lived, amount=100, to="acct-A")
    assert len(bank.wires) == 1


def test_an_approval_written_before_calls_were_bound_asks_again() -> None:
    world, bank = keyed_world(), Bank()
    legacy = [
        HUMAN.envelope("wf", "wire", ev.ApprovalRequested(tool="wire")),
        HUMAN.envelope("wf", "wire", ev.ApprovalDecided(granted=True, by="old-cli")),
    ]
    for event in legacy:
        world.log.append(event)
    wf = world.ledger().workflow("wf")
    with pytest.raises(ApprovalPendingError):
        wf.step("wire", bank.tool(), amount=9000, to="acct-B")
    assert bank.wires == []
    assert (
        requests(world)[-1].reason
        == "asked again: the approval names no call: asking again for this one"
    )


def test_a_denied_step_stays_denied_whatever_it_is_called_with() -> None:
    world, bank = keyed_world(), Bank()
    with pytest.raises(ApprovalPendingError):
        ask(world.ledger(), bank.tool(), amount=100, to="acct-A")
    decide(world, granted=False)
    with pytest.raises(Exception, match="denied"):
        ask(world.ledger(), bank.tool(), amount=1, to="acct-A")
    assert bank.wires == [] and len(requests(world)) == 1


def test_approval_valid_for_needs_an_approval_gate() -> None:
    with pytest.raises(ToolDefinitionError, match="approval_valid_for needs"):
        Tool(name="x", effect="irreversible", approval_valid_for=10)


def test_the_fold_keeps_one_request_per_number_and_a_denial_final() -> None:
    f = EventFactory("fleet", "agent")

    def asked(number: int, digest: str) -> ev.Event:
        body = ev.ApprovalRequested(tool="wire", arguments_digest=digest, request=number)
        return f.envelope("wf", "wire", body, "request", number, digest)

    def answer(granted: bool, digest: str, number: int) -> ev.Event:
        body = ev.ApprovalDecided(
            granted=granted, by="ann", arguments_digest=digest, request=number
        )
        return f.envelope("wf", "wire", body)

    state = replay("wf", [asked(1, "a" * 64), asked(1, "b" * 64)])
    gate = state.steps["wire"].approval
    assert gate is not None and gate.digest == "a" * 64  # the log's first request 1 stands
    assert [a.kind for a in state.anomalies] == ["stale_approval_request"]
    state = replay("wf", [asked(1, "a" * 64), asked(2, "b" * 64), answer(True, "b" * 64, 1)])
    assert state.steps["wire"].status is StepStatus.AWAITING_APPROVAL  # it named request 1
    assert [a.kind for a in state.anomalies] == ["stale_approval"]
    state = replay("wf", [asked(1, "a" * 64), answer(False, "a" * 64, 1), asked(2, "b" * 64)])
    assert state.steps["wire"].status is StepStatus.DENIED
    assert [a.kind for a in state.anomalies] == ["late_approval_request"]


# -- one fingerprint binds an approval to its call, secrets included (issue 42) ----------------


class Cards:
    """A card processor that counts its charges, by card."""

    def __init__(self) -> None:
        self.charged: list[tuple[int, str, str]] = []
        self.refuse_next = False

    def charge(self, args: dict[str, Any], key: str) -> dict[str, Any]:
        if self.refuse_next:
            self.refuse_next = False
            raise ValueError("card declined")  # a definite failure: nothing charged
        self.charged.append((args["amount"], args["card"], key))
        return {"charged": args["amount"]}

    def tool(self) -> Tool:
        return Tool(
            name="pay",
            effect="irreversible",
            requires_approval=True,
            secret_args=frozenset({"card"}),
            run=self.charge,
        )


CARD_A, CARD_B = "4111111111111111", "5500000000000004"


def test_an_approval_of_100_on_card_a_does_not_cover_card_b() -> None:
    world, cards = keyed_world(), Cards()
    with pytest.raises(ApprovalPendingError):
        world.ledger().workflow("wf").step("pay", cards.tool(), amount=100, card=CARD_A)
    reader = InMemoryHistory(world.log)
    approval.decide(world.log, HUMAN, reader, "wf", "pay", granted=True, by="alice")
    # The resumed agent calls the same step with the same amount on another card.
    with pytest.raises(ApprovalPendingError):
        world.ledger().workflow("wf").step("pay", cards.tool(), amount=100, card=CARD_B)
    assert cards.charged == [], "card B was charged under the approval of card A"
    first, second = requests(world)
    assert first.arguments_digest != second.arguments_digest
    assert second.reason is not None and "differs from the one approved" in second.reason
    # What the person is shown of each card is a keyed mark, never the number.
    assert CARD_A not in (first.arguments_json or "") and CARD_B not in str(world.log.events)
    assert json.loads(first.arguments_json or "")["card"].startswith("[redacted:hmac-sha256:")


def test_a_retry_after_a_definite_failure_under_a_new_key_is_still_the_approved_call() -> None:
    world, cards = keyed_world(), Cards()
    with pytest.raises(ApprovalPendingError):
        world.ledger().workflow("wf").step("pay", cards.tool(), amount=100, card=CARD_A)
    reader = InMemoryHistory(world.log)
    approval.decide(world.log, HUMAN, reader, "wf", "pay", granted=True, by="alice")
    wf = world.ledger().workflow("wf")
    cards.refuse_next = True
    with pytest.raises(ValueError, match="declined"):
        wf.step("pay", cards.tool(), amount=100, card=CARD_A)
    assert wf.step("pay", cards.tool(), amount=100, card=CARD_A) == {"charged": 100}
    intents = [e.body for e in world.log.events if isinstance(e.body, ev.StepIntended)]
    assert [i.attempt for i in intents] == [1, 2]
    assert intents[0].idempotency_key != intents[1].idempotency_key, "a new key"
    assert intents[0].arguments_digest == intents[1].arguments_digest, "the same call"
    assert len(requests(world)) == 1, "no second approval asked for"
    assert [(a, c) for a, c, _ in cards.charged] == [(100, CARD_A)]


def test_a_secret_tool_that_requires_approval_needs_a_redaction_key() -> None:
    cards = Cards()
    with pytest.raises(ToolDefinitionError) as refused:
        Ledger(log=InMemoryEventLog(), tools=[cards.tool()])
    message = str(refused.value)
    assert "\n" not in message and "redaction key" in message and "'card'" in message
    # A tool the ledger was not given is refused at its first call, before any request.
    world = World()
    with pytest.raises(ToolDefinitionError, match="redaction key"):
        world.ledger().workflow("wf").step("pay", cards.tool(), amount=100, card=CARD_A)
    assert requests(world) == [] and cards.charged == []


def test_wait_for_approval_is_deprecated_and_still_answers() -> None:
    world, bank = keyed_world(), Bank()
    tool = bank.tool()
    ledger = world.ledger()
    with pytest.raises(ApprovalPendingError):
        ask(ledger, tool, amount=100, to="acct-A")
    wf = ledger.workflow("wf")
    with pytest.warns(DeprecationWarning, match="call the step again"):
        assert wf.wait_for_approval("wire", 0) is StepStatus.AWAITING_APPROVAL

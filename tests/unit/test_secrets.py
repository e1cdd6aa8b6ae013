"""Secret arguments: paths, redaction, scrubbing, the digest, brute force, definition refusals."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import load_settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain.context import render
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.ids import canonical_json
from stepledger.domain.replay import mismatch
from stepledger.domain.secrets import MARKER, RedactionKey, Scrubber
from stepledger.domain.state import replay
from stepledger.domain.tools import NotFound, Tool
from stepledger.errors import ConfigError, PlanMismatchError, StepInDoubtError, ToolDefinitionError
from stepledger.log import InMemoryEventLog
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver
from tests.unit.factories import Clock, factory
from tests.unit.resume_fakes import MovableClock
from tests.unit.secret_leaks import (
    ARGS,
    CARD,
    CVV,
    LISTED_CARD,
    NESTED_CARD,
    NESTED_CVV,
    NOTE,
    crack,
    leaks,
    secret_tool,
)

KEY = RedactionKey("operator-secret-0123456789")


def keyed_factory() -> EventFactory:
    return EventFactory("fleet", "producer", Clock(), KEY)


def body(event: ev.Event) -> Any:
    return event.body


# -- declaring secrets -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["", "a..b", ".a", "a.", "a[0]", "a[", "[]", "a b", "a.[]"])
def test_invalid_secret_paths_are_refused_at_definition(path: str) -> None:
    with pytest.raises(ToolDefinitionError, match="secret path is names"):
        Tool(name="t", effect="irreversible", secret_args={path})


def test_valid_secret_paths_are_accepted() -> None:
    tool = secret_tool()
    assert tool.secret_args == {"card", "cvv", "payment.card", "payment.cvv", "cards[].number"}
    Tool(name="t", effect="irreversible", secret_args={"tokens[]", "grid[][]", "a-b.c_d"})


def test_readme_charge_card_is_refused_with_the_reason() -> None:
    # Keyed, default policy redrive, no redrive hook: recovery would charge the marker.
    with pytest.raises(ToolDefinitionError) as info:
        Tool(name="charge_card", effect="idempotent", keyed=True, secret_args={"card"})
    message = str(info.value)
    assert "policy 'redrive' with secret_args ('card') needs a redrive hook" in message
    assert "only the redacted arguments" in message


def test_hooks_handed_redacted_arguments_must_say_they_fetch_the_secrets() -> None:
    def undo(args: dict[str, Any], key: str, known: Any) -> None:
        return None

    with pytest.raises(ToolDefinitionError, match="compensate hook gets only the redacted"):
        Tool(name="book", effect="compensatable", compensate=undo, secret_args={"card"})
    redrive = {"redrive": lambda args, key: None}
    with pytest.raises(ToolDefinitionError, match="redrive hook gets only the redacted"):
        Tool(name="pay", effect="idempotent", keyed=True, secret_args={"card"}, **redrive)
    Tool(name="book", effect="compensatable", compensate=undo, secret_args={"card"},
         hooks_fetch_secrets=True)  # fmt: skip
    Tool(name="pay", effect="idempotent", keyed=True, secret_args={"card"},
         hooks_fetch_secrets=True, **redrive)  # fmt: skip


def test_every_secret_problem_is_listed_at_once() -> None:
    with pytest.raises(ToolDefinitionError) as info:
        Tool(
            name="t",
            effect="compensatable",
            policy="compensate",
            compensate=lambda a, k, r: None,
            secret_args={"a..b", "card"},
        )
    message = str(info.value)
    assert "'a..b'" in message and "compensate hook gets only the redacted" in message


def test_tools_that_never_replay_secrets_from_the_log_need_no_declaration() -> None:
    Tool(name="lookup", effect="read_only", secret_args={"token"})  # its agent re-runs it
    Tool(name="wire", effect="irreversible", secret_args={"iban"})  # escalated to a human
    secret_tool()  # queried by key; not found means not happened, the agent runs it again


# -- what is recorded --------------------------------------------------------------------


def test_nested_and_listed_secrets_are_redacted_to_the_fixed_marker() -> None:
    recorded = secret_tool().redact(ARGS)
    assert recorded == {
        "amount": 1250,
        "card": MARKER,
        "cvv": MARKER,
        "note": NOTE,
        "payment": {"card": MARKER, "cvv": MARKER, "currency": "EUR"},
        "cards": [{"number": MARKER, "label": "amex"}],
    }


def test_a_path_that_cannot_be_followed_redacts_the_whole_value() -> None:
    tool = secret_tool()
    recorded = tool.redact({"payment": f"card {NESTED_CARD}", "cards": CARD})
    assert recorded == {"payment": MARKER, "cards": MARKER}


def test_keyed_markers_are_an_hmac_salted_by_the_workflow_and_the_step() -> None:
    first = keyed_factory().intent("w", "s", secret_tool(), ARGS, sequence=0)
    retry = keyed_factory().intent("w", "s", secret_tool(), ARGS, sequence=0, attempt=2)
    other = keyed_factory().intent("w2", "s", secret_tool(), ARGS, sequence=0)
    recorded = body(first).arguments_json
    assert leaks(recorded) == [] and '"card":"[redacted:hmac-sha256:' in recorded
    assert recorded != body(other).arguments_json  # no correlation across workflows
    # Every attempt of one call is the same call: a new key, the same marks and fingerprint.
    assert body(retry).idempotency_key != body(first).idempotency_key
    assert body(retry).arguments_json == recorded
    assert body(retry).arguments_digest == body(first).arguments_digest
    # Whoever holds the key can check a value against the record; nobody else can.
    expected = KEY.mark("stepledger.secret", "w", "s", "cvv", f'"{CVV}"')
    assert f'"cvv":"{expected}"' in recorded
    assert repr(KEY) == "RedactionKey(***)" and "operator-secret" not in repr(keyed_factory())


def test_redaction_key_setting_is_hidden_and_must_be_long() -> None:
    settings = load_settings(env={"STEPLEDGER_REDACTION_KEY": "operator-secret-0123456789"})
    assert settings.redaction_key is not None and "operator-secret" not in repr(settings)
    with pytest.raises(ConfigError, match="redaction_key"):
        load_settings(env={"STEPLEDGER_REDACTION_KEY": "short"})


def test_the_fingerprint_binds_secrets_only_with_a_redaction_key() -> None:
    tool = secret_tool()
    same_but_secrets = {**ARGS, "card": "4000000000000002", "cvv": "123"}
    other = {**ARGS, "amount": 9999}
    for f, key in ((factory(), None), (keyed_factory(), KEY)):
        state = replay("w", [f.intent("w", "s", tool, ARGS, sequence=0)])

        def fp(arguments: dict[str, Any], key: RedactionKey | None = key) -> str:
            return tool.fingerprint(arguments, workflow_id="w", step_id="s", key=key)

        assert mismatch(state, "s", tool.name, fp(ARGS), 0) is None
        assert "recorded as another call" in str(mismatch(state, "s", tool.name, fp(other), 0))
        secrets_differ = mismatch(state, "s", tool.name, fp(same_but_secrets), 0)
        # Without the key nothing recorded depends on a secret: another card is not seen.
        assert (secrets_differ is None) is (key is None), secrets_differ
        recorded = f.intent("w", "s", tool, ARGS, sequence=0).body
        assert isinstance(recorded, ev.StepIntended) and fp(ARGS) == recorded.arguments_digest


def test_plan_mismatch_still_raised_for_changed_non_secret_arguments() -> None:
    ledger = Ledger(log=InMemoryEventLog(), tools=[secret_tool()])
    wf = ledger.workflow("w")
    wf.step("charge", secret_tool(), ARGS, fn=lambda a, k: "ok")
    again = ledger.workflow("w")
    assert again.step("charge", secret_tool(), {**ARGS, "cvv": "999"}, fn=lambda a, k: 1) == "ok"
    third = ledger.workflow("w")
    with pytest.raises(PlanMismatchError):
        third.step("charge", secret_tool(), {**ARGS, "amount": 1}, fn=lambda a, k: 1)


# -- brute force -------------------------------------------------------------------------


def recorded_texts(events: list[ev.Event]) -> list[str]:
    return [e.model_dump_json() for e in events]


def old_main_intent(arguments: dict[str, Any], key: str) -> str:
    """What main recorded before this change: a sha256 salted with the key beside it."""
    marker = (
        "redacted:sha256:" + hashlib.sha256(f"{key}\x1f{arguments['cvv']}".encode()).hexdigest()
    )
    digest = hashlib.sha256(canonical_json(arguments).encode()).hexdigest()
    redacted = {**arguments, "cvv": marker[:32]}
    return canonical_json({"idempotency_key": key, "arguments_json": canonical_json(redacted),
                           "arguments_digest": digest})  # fmt: skip


def test_the_attacker_cracks_the_old_recording() -> None:
    # The control: the attack below works against what main recorded before.
    arguments = {"amount": 1250, "cvv": CVV}
    assert crack([old_main_intent(arguments, "sl-abc")], arguments, "cvv") == {CVV}


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "keyed"])
def test_enumerating_every_cvv_finds_nothing_in_what_is_recorded(keyed: bool) -> None:
    f = keyed_factory() if keyed else factory()
    tool = secret_tool()
    events = [
        f.intent("w", "s", tool, ARGS, sequence=0),
        f.outcome(
            "w",
            "s",
            attempt=1,
            status=OutcomeStatus.FAILED,
            error=ValueError(f"cvv {CVV} / {NESTED_CVV} rejected for {ARGS}"),
            scrub=tool.scrubber(ARGS),
        ),
    ]
    texts = recorded_texts(events)
    assert leaks("\n".join(texts)) == []
    # The attacker even knows every other argument in clear; only the CVV is guessed.
    assert crack(texts, ARGS, "cvv") == set()
    assert crack(texts, ARGS, "payment.cvv") == set()


# -- scrubbing ---------------------------------------------------------------------------


def test_every_string_form_of_a_secret_is_scrubbed_from_texts() -> None:
    scrub = secret_tool().scrubber(ARGS)
    grouped = "4111 1111 1111 1111 / 4111-1111-1111-1111"
    text = scrub.text(f"{CARD} {grouped} {ARGS!r} cvv={CVV} pin:{NESTED_CVV} {LISTED_CARD}")
    assert leaks(text) == [] and NOTE in text
    assert scrub.text(f"json {canonical_json(ARGS)}").count(MARKER) == 5


def test_short_secrets_inside_longer_numbers_are_left_alone() -> None:
    scrub = Scrubber([CVV])
    assert scrub.text(f"order 1{CVV}9 ok, cvv{CVV}") == f"order 1{CVV}9 ok, cvv{MARKER}"


def test_results_are_scrubbed_structurally() -> None:
    scrub = secret_tool().scrubber(ARGS)
    result = {"echo": ARGS, "pan": int(CARD), "amount": 737_00, CARD: [f"x {NESTED_CARD}"]}
    cleaned = scrub.value(result)
    assert leaks(canonical_json(cleaned)) == []
    assert cleaned["pan"] == MARKER and cleaned["amount"] == 73700
    assert cleaned["echo"]["note"] == NOTE


def test_the_sdk_and_recovery_record_no_secret_anywhere(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[dict[str, Any]] = []

    def query(args: dict[str, Any], key: str) -> NotFound:
        seen.append(args)
        raise RuntimeError(f"lookup of {args} failed")

    tool = secret_tool(query=query, timeout_s=1, max_attempts=1)
    log, clock, letters = InMemoryEventLog(), MovableClock(), MemoryEventLetters()
    ledger = Ledger(log=log, clock=clock, tools=[tool], dead_letters=letters)
    wf = ledger.workflow("w")

    def declined(args: dict[str, Any], key: str) -> None:
        raise ValueError(f"card {args['card']} (cvv {args['cvv']}) declined: {args}")

    with pytest.raises(ValueError, match=CARD):  # the agent's own exception is untouched
        wf.step("declined", tool, ARGS, fn=declined)
    assert wf.step("charged", tool, ARGS, fn=lambda a, k: {"id": "ch_1", "echo": a})["id"]

    def timed_out(args: dict[str, Any], key: str) -> None:
        raise TimeoutError(f"no answer for {args['payment']}")

    with pytest.raises(StepInDoubtError) as doubt:
        wf.step("doubt", tool, ARGS, fn=timed_out)
    context = render(wf.context())
    # Recovery: the query hook fails (it got the redacted arguments), then recovery gives up.
    resolver = Resolver(log, ledger.events, ToolRegistry([tool]), dead_letters=letters, clock=clock)
    state = replay("w", log.events)
    for _ in range(2):
        clock.advance(60)
        resolver.attempt(state, "doubt")
    assert state.steps["doubt"].escalation_open and len(letters.letters) == 1
    assert seen and seen[0]["card"] == MARKER and seen[0]["payment"]["card"] == MARKER
    encoded = b"".join(Codec().encode(e) for e in log.events)
    letter = letters.letters[0]
    for where in (encoded, str(doubt.value), context, caplog.text, letter.reason):
        assert leaks(where) == [], where
    assert NOTE.encode() in encoded and MARKER in str(doubt.value)
    assert body(log.events[2]).error.startswith(f"card {MARKER} (cvv {MARKER}) declined")

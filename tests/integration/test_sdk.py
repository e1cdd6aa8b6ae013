"""The SDK against a real broker: durable intents, failed outcomes, broker down, concurrency."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.tools import Tool
from stepledger.errors import DurabilityError
from stepledger.kafka.reader import read_topic
from stepledger.producer import Ledger, Workflow
from stepledger_dev.broker import free_port

PAY = Tool(name="pay", effect="idempotent", keyed=True)


def events_of(settings: Settings) -> list[Any]:
    return [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]


def test_step_brackets_call_with_durable_intent_and_outcome(settings: Settings) -> None:
    seen: list[str] = []

    def charge(args: dict[str, Any], key: str) -> int:
        seen.append(key)
        return 42

    with Ledger(settings) as ledger:
        wf = ledger.start("wf-1")
        result = wf.step("charge", PAY, {"amount": 5}, fn=charge)
    assert result == 42
    events = events_of(settings)
    assert [e.type for e in events] == ["workflow_started", "step_intended", "step_outcome"]
    intent, outcome = events[1].body, events[2].body
    assert seen == [intent.idempotency_key]
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.result_json == "42"


def test_failing_tool_records_failed_outcome_and_reraises(settings: Settings) -> None:
    def boom(args: dict[str, Any], key: str) -> None:
        raise ValueError("card declined")

    with Ledger(settings) as ledger:
        wf = ledger.start("wf-2")
        with pytest.raises(ValueError, match="card declined"):
            wf.step("charge", PAY, {"amount": 5}, fn=boom)
    outcome = events_of(settings)[-1].body
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == "card declined" and outcome.error_type == "ValueError"


def test_broker_down_means_tool_never_called() -> None:
    dead = Settings(bootstrap=f"127.0.0.1:{free_port()}", topic="t", durable_timeout_s=1.5)
    called = threading.Event()
    ledger = Ledger(dead)
    with pytest.raises(DurabilityError):
        ledger.start("wf-3")
    wf_handle = Workflow(ledger, "wf-3")
    with pytest.raises(DurabilityError):
        wf_handle.step("charge", PAY, {"amount": 1}, fn=lambda a, k: called.set())
    assert not called.is_set()


def test_concurrent_agents_wait_only_for_their_own_record(settings: Settings) -> None:
    """A slow tool in one agent does not delay the durable writes of the seven others."""
    release = threading.Event()
    done: dict[int, float] = {}
    with Ledger(settings) as ledger:

        def agent(i: int) -> None:
            wf = ledger.start(f"wf-c{i}")
            fn = (lambda a, k: release.wait(20)) if i == 0 else (lambda a, k: i)
            wf.step("s", PAY, {"i": i}, fn=fn)
            done[i] = time.monotonic()

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len(done) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(done) == list(range(1, 8)), "seven agents finished while agent 0 was blocked"
        release.set()
        for t in threads:
            t.join(20)
    assert 0 in done


def test_ack_journal_lists_exactly_the_acknowledged_events(
    make_settings: Any, tmp_path: Any
) -> None:
    journal = tmp_path / "acks.txt"
    settings = make_settings(ack_journal=str(journal))
    with Ledger(settings) as ledger:
        ledger.start("wf-j").step("charge", PAY, {"amount": 1}, fn=lambda a, k: 1)
    logged = [e.event_id for e in events_of(settings)]
    assert journal.read_text().split() == logged and len(logged) == 3

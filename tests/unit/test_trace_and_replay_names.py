"""The names issue 25 put on the wire (replay headers, spans, client ids) as the code uses them."""

from __future__ import annotations

from stepledger import tracing, wire
from stepledger.deadletters import readback
from stepledger.wire import client_id, stepledger_version


def test_replay_headers_are_declared_dead_letter_headers() -> None:
    used = {readback.REPLAY_OF, readback.REPLAYED, readback.REPLAYED_TO}
    assert used == {"replay_of", "replayed", "replayed_to"} and used <= wire.DEAD_LETTER_HEADERS
    assert wire.DEAD_LETTER_REPLAY_STAGE == "replay"


def test_span_names_and_attributes_are_pinned() -> None:
    assert {
        "stepledger.step",
        "stepledger.call",
        "stepledger.workflow.open",
        "stepledger.decision",
    } == wire.SPANS
    used = {
        tracing.WORKFLOW_ID,
        tracing.STEP_ID,
        tracing.TOOL,
        tracing.ATTEMPT,
        tracing.POLICY,
        tracing.IDEMPOTENCY_KEY,
        tracing.REPLAYED,
        tracing.DECISION,
        tracing.EVENT_TYPE,
        tracing.PIPELINED,
    }
    assert used <= wire.SPAN_ATTRIBUTES
    assert tracing.PIPELINED == "stepledger.pipelined"
    assert wire.TRACEPARENT_HEADER == "traceparent" and wire.TRACER_NAME == "stepledger"


def test_daemon_client_ids_carry_role_and_version() -> None:
    assert client_id("recovery") == f"stepledger-recovery/{stepledger_version()}"
    assert client_id("projector") == f"stepledger-projector/{stepledger_version()}"

"""Names this release puts on the wire (headers, span names, client ids) are pinned here."""

from __future__ import annotations

from stepledger import tracing
from stepledger.clientid import client_id, stepledger_version
from stepledger.deadletters import readback
from stepledger.deadletters.letter import HEADER_PREFIX


def test_dead_letter_replay_headers_are_pinned() -> None:
    assert HEADER_PREFIX + readback.REPLAY_OF == "dlq_replay_of"
    assert HEADER_PREFIX + readback.REPLAYED == "dlq_replayed"
    assert HEADER_PREFIX + readback.REPLAYED_TO == "dlq_replayed_to"
    assert readback.REPLAY_STAGE == "replay"


def test_trace_names_are_pinned() -> None:
    assert tracing.TRACEPARENT == "traceparent" and tracing.TRACER == "stepledger"
    assert (tracing.WORKFLOW_ID, tracing.STEP_ID, tracing.TOOL) == (
        "stepledger.workflow_id",
        "stepledger.step_id",
        "stepledger.tool",
    )
    assert (tracing.ATTEMPT, tracing.POLICY, tracing.IDEMPOTENCY_KEY, tracing.REPLAYED) == (
        "stepledger.attempt",
        "stepledger.policy",
        "stepledger.idempotency_key",
        "stepledger.replayed",
    )


def test_daemon_client_ids_carry_role_and_version() -> None:
    assert client_id("recovery") == f"stepledger-recovery/{stepledger_version()}"
    assert client_id("projector").startswith("stepledger-projector/")

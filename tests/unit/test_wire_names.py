"""Names on the wire are pinned: a change here is a CHANGELOG entry with an upgrade step.

Each value below is written out as a literal on purpose.  If a test here fails, a name that
running deployments depend on (where a fleet on defaults writes, where a group's offsets
live, what an alert rule matches) changed: restore it, or release it with a migration.
"""

from __future__ import annotations

from typing import get_args

from stepledger import wire
from stepledger.config import Settings
from stepledger.deadletters.letter import DeadLetter, dead_letter_info
from stepledger.domain.events import EventType
from stepledger.kafka import Position
from stepledger.log import event_headers
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.recovery.metrics import RecoveryMetrics
from tests.unit.factories import factory

PINNED = {
    "STEP_LOG_TOPIC": "stepledger.events",
    "STEP_LOG_TIMESTAMP_TYPE": "LogAppendTime",
    "CHECKPOINT_DIRECTORY_KEY": "\x00directory",
    "CHECKPOINT_DIRECTORY_CHUNK_PREFIX": "\x00directory/",
    "CHECKPOINT_DIRECTORY_HEADER": "stepledger_directory",
    "DERIVED_NAME_SEPARATOR": ".",
    "DEAD_LETTER_ROLE": "deadletters",
    "CHECKPOINT_ROLE": "checkpoints",
    "RECOVERY_STATE_ROLE": "recovery-state",
    "PROJECTOR_ROLE": "projector",
    "LAKE_PROJECTOR_ROLE": "lake-projector",
    "RECOVERY_ROLE": "recovery",
    "WORKFLOW_READER_ROLE": "workflow-reader",
    "WORKFLOW_INDEX_ROLE": "workflow-index",
    "POSITION_CHECK_ROLE": "position-check",
    "READER_ROLE": "reader",
    "CHECKPOINTER_ROLE": "checkpointer",
    "CHECKPOINT_READER_ROLE": "checkpoint-reader",
    "LOG_START_ROLE": "log-start",
    "RECOVERY_CHANGELOG_ROLE": "recovery-changelog-reader",
    "STATE_ADOPTION_ROLE": "state-adoption",
    "LOG_IDENTITY_HEADER": "stepledger_log",
    "PREVIOUS_DEAD_LETTER_TOPIC": "stepledger.deadletter",
    "RENAMED_DEAD_LETTER_TOPIC": "stepledger.deadletters.letter",
    "PREVIOUS_CHECKPOINT_TOPIC": "stepledger.checkpoints.workflow",
    "PREVIOUS_RECOVERY_STATE_TOPIC": "stepledger.recovery.changelog",
    "PREVIOUS_PROJECTOR_GROUP": "stepledger-projector",
    "PREVIOUS_RECOVERY_GROUP": "stepledger-recovery",
    "RECOVERY_CLIENT_ID": "stepledger-recovery",
    "PROJECTOR_CLIENT_ID": "stepledger-projector",
    "CHECKPOINTER_CLIENT_ID": "stepledger-checkpointer",
    "CLIENT_VERSION_SEPARATOR": "/",
    "CLIENT_ID_PREFIX": "stepledger-",
    "TOOLS_ENTRY_POINT_GROUP": "stepledger.tools",
    "CE_SPECVERSION_HEADER": "ce_specversion",
    "CE_TYPE_HEADER": "ce_type",
    "CE_ID_HEADER": "ce_id",
    "CE_SOURCE_HEADER": "ce_source",
    "CE_SPECVERSION": "1.0",
    "CE_TYPE_PREFIX": "stepledger.",
    "CE_SOURCE_PREFIX": "stepledger/",
    "DEAD_LETTER_HEADER_PREFIX": "dlq_",
    "INBOX_VERSION_HEADER": "x-inbox-version",
    "DEAD_LETTER_REPLAY_STAGE": "replay",
    "TRACEPARENT_HEADER": "traceparent",
    "TRACER_NAME": "stepledger",
    "MODEL_STEP_TOOL": "model",
    "AUTO_STEP_ID_SEPARATOR": "#",
    "BUDGET_ROLE": "budget",
    "BUDGET_READER_ROLE": "budget-reader",
}

EVENT_TYPES = (
    "workflow_started",
    "workflow_resumed",
    "workflow_finished",
    "workflow_dead_lettered",
    "step_intended",
    "step_outcome",
    "compensation_intended",
    "compensation_outcome",
    "step_abandoned",
    "resolution_attempted",
    "escalation_resolved",
    "approval_requested",
    "approval_decided",
    "anomaly_observed",
    "model_turn_reused",
    "workflow_paused",
    "workflow_unpaused",
    "workflow_cancel_requested",
    "budget_reserved",
    "budget_settled",
    "budget_raised",
)


def test_every_pinned_name_is_unchanged() -> None:
    found = {name: getattr(wire, name) for name in PINNED}
    assert found == PINNED


def test_every_name_the_module_declares_is_pinned() -> None:
    declared = {n for n, v in vars(wire).items() if n.isupper() and isinstance(v, str)}
    assert declared == set(PINNED), "a new wire name must be pinned here (and in the CHANGELOG)"


def test_defaults_and_groups_use_the_pinned_names() -> None:
    settings = Settings()
    assert settings.topic == "stepledger.events"
    assert settings.dlq_topic == "stepledger.events.deadletters"
    assert settings.checkpoint_topic == "stepledger.events.checkpoints"
    assert settings.recovery_state_topic == "stepledger.events.recovery-state"
    assert settings.projector_group == "stepledger.events.projector"
    assert settings.lake_projector_group == "stepledger.events.lake-projector"
    assert settings.recovery_group == "stepledger.events.recovery"
    assert settings.budget_topic == "stepledger.events.budget"
    assert settings.group("workflow-index") == "stepledger.events.workflow-index"
    assert wire.RECOVERY_CLIENT_ID == "stepledger-recovery"
    assert wire.TOOLS_ENTRY_POINT_GROUP == "stepledger.tools"


def test_event_types_are_appended_never_renamed() -> None:
    types = get_args(EventType)
    assert types[: len(EVENT_TYPES)] == EVENT_TYPES, "event types are only ever appended"


def test_event_headers_are_cloudevents_binary_mode() -> None:
    event = factory().workflow_started("wf-1", name="n", attempt=1, read_only=False, max_attempts=5)
    headers = dict(event_headers(event))
    assert set(headers) == {"ce_specversion", "ce_type", "ce_id", "ce_source"}
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_type"] == f"stepledger.{event.type}".encode()
    assert headers["ce_source"] == f"stepledger/{event.fleet_id}/{event.producer_id}".encode()


def test_dead_letter_headers_are_the_declared_ones() -> None:
    letter = DeadLetter(b"k", b"v", [], Position("t", 0, 7), "decode", "bad", "g")
    names = {name for name, _ in letter.all_headers()}
    assert all(name.startswith("dlq_") for name in names)
    assert set(dead_letter_info(letter.all_headers())) <= wire.DEAD_LETTER_HEADERS
    assert {"stage", "error", "topic", "partition", "offset"} <= wire.DEAD_LETTER_HEADERS
    big = DeadLetter(b"k", b"v" * 5000, [], Position("t", 0, 7), "decode", "bad", "g")
    _, _, cut = big.fitted(1000)
    assert "truncated" in dead_letter_info(cut)
    assert set(dead_letter_info(cut)) <= wire.DEAD_LETTER_HEADERS


def test_metric_names_are_the_declared_ones() -> None:
    projector = {m.name for m in ProjectorMetrics().registry.collect()}
    recovery = {m.name for m in RecoveryMetrics().registry.collect()}
    assert projector == wire.PROJECTOR_METRICS
    assert recovery == wire.RECOVERY_METRICS
    assert "stepledger_projector_events" in projector
    # The token ledger's counters (per fleet and model): names a dashboard depends on.
    assert {
        "stepledger_projector_model_tokens_incurred",
        "stepledger_projector_model_tokens_reused",
    } <= projector
    assert "stepledger_recovery_oldest_overdue_intent_seconds" in recovery


def test_two_step_logs_on_defaults_share_no_state_topic_nor_group() -> None:
    """Defect 1 of issue 42: every step log had the same checkpoint topic (and dead-letter
    topic, recovery changelog and groups) unless an operator changed them one by one."""
    a, b = Settings(topic="orders"), Settings(topic="refunds")
    names = ("dlq_topic", "checkpoint_topic", "recovery_state_topic")
    groups = ("projector_group", "lake_projector_group", "recovery_group")
    for name in (*names, *groups):
        assert getattr(a, name) != getattr(b, name), name
        assert getattr(a, name).startswith("orders.")  # one prefix covers a deployment
    roles = [v for n, v in vars(wire).items() if n.endswith("_ROLE")]
    assert {a.group(r) for r in roles}.isdisjoint({b.group(r) for r in roles})


def test_a_given_name_wins_over_the_derived_one() -> None:
    settings = Settings(topic="orders", checkpoint_topic="stepledger.checkpoints.workflow")
    assert settings.checkpoint_topic == "stepledger.checkpoints.workflow"
    assert settings.dlq_topic == "orders.deadletters"

"""Every name that leaves the process: topics, consumer groups, client ids, headers, metrics.

These names are a contract with running deployments (a default topic name is where a fleet
on defaults writes; a group id is where a daemon's committed offsets live; a metric name is
what alert rules match), so they are literals here, never derived from a Python module path
that a refactor can move.  ``tests/unit/test_wire_names.py`` pins every one of them: changing
a name is a CHANGELOG entry with an upgrade step, never a side effect of a rename.
"""

from __future__ import annotations

# -- topics ---------------------------------------------------------------------------------

STEP_LOG_TOPIC = "stepledger.events"
"""The default step-log topic."""
DEAD_LETTER_TOPIC = "stepledger.deadletter"
"""The default dead-letter topic (undecodable or invalid input, with the reason in headers)."""
RENAMED_DEAD_LETTER_TOPIC = "stepledger.deadletters.letter"
"""The dead-letter default a refactor put on ``main`` by mistake; ``dlq list`` points to it."""
CHECKPOINT_TOPIC = "stepledger.checkpoints.workflow"
"""The default compacted topic of workflow checkpoints (partitioned like the step log)."""
RECOVERY_STATE_TOPIC = "stepledger.recovery.changelog"
"""The default compacted topic of the recovery daemons' per-partition state."""
CHECKPOINT_DIRECTORY_KEY = "\x00directory"
"""The record key of a checkpoint partition's directory root (no workflow id starts with NUL)."""
CHECKPOINT_DIRECTORY_CHUNK_PREFIX = "\x00directory/"
"""A directory chunk's record key: this prefix and its bucket number in decimal."""

STEP_LOG_TIMESTAMP_TYPE = "LogAppendTime"
"""How ``init`` has the step log's records stamped: by the broker (deadlines anchor on it)."""

# -- consumer groups and client ids -----------------------------------------------------------

PROJECTOR_GROUP = "stepledger-projector"
"""The projector daemons' consumer group."""
RECOVERY_GROUP = "stepledger-recovery"
"""The recovery daemons' consumer group."""
RECOVERY_CLIENT_ID = "stepledger-recovery"
"""The client id (prefix) of every recovery daemon's consumer, which tells other groups' apart."""
PROJECTOR_CLIENT_ID = "stepledger-projector"
"""The client id (prefix) of every projector's consumer."""
CLIENT_VERSION_SEPARATOR = "/"
"""A daemon's client id is its prefix, this, and the stepledger version (``stepledger doctor``)."""
WORKFLOW_READER_GROUP = "stepledger-workflow-reader"
"""The group id of the SDK's partition reads (assigned, never joined nor committed)."""
WORKFLOW_INDEX_GROUP = "stepledger-workflow-index"
"""The group id of the SDK's partition index (assigned, never joined nor committed)."""
POSITION_CHECK_GROUP = "stepledger-position-check"
"""The group id of the projector's position check (assigned, never committed)."""
READER_GROUP = "stepledger-reader"
"""The group id of whole-topic reads (tail, dead letters, escalations; never committed)."""
CHECKPOINTER_GROUP = "stepledger-checkpointer"
"""The group id of the checkpointer's step-log reads (assigned, never joined nor committed)."""
CHECKPOINT_READER_GROUP = "stepledger-checkpoint-reader"
"""The group id of checkpoint-topic reads (assigned, never committed)."""
LOG_START_GROUP = "stepledger-log-start"
"""The group id of the client that asks partitions' log starts (never reads, never commits)."""
RECOVERY_CHANGELOG_GROUP = "stepledger-recovery-changelog-reader"
"""The group id of a recovery daemon's changelog restore (assigned, never committed)."""
TOOLS_ENTRY_POINT_GROUP = "stepledger.tools"
"""The Python entry-point group where packages register their tools."""

# -- record headers ---------------------------------------------------------------------------

CHECKPOINT_DIRECTORY_HEADER = "stepledger_directory"
"""On every checkpoint-topic record: the offset of the partition's newest directory root."""
CE_SPECVERSION_HEADER = "ce_specversion"
CE_TYPE_HEADER = "ce_type"
CE_ID_HEADER = "ce_id"
CE_SOURCE_HEADER = "ce_source"
CE_SPECVERSION = "1.0"
"""CloudEvents binary mode: the spec version every event record declares."""
CE_TYPE_PREFIX = "stepledger."
"""``ce_type`` is this prefix and the event type (``stepledger.step_intended``)."""
CE_SOURCE_PREFIX = "stepledger/"
"""``ce_source`` is this prefix, the fleet id, ``/`` and the producer id."""
DEAD_LETTER_HEADER_PREFIX = "dlq_"
"""Every header a dead letter adds starts with this prefix."""
DEAD_LETTER_HEADERS = frozenset(
    {
        "stage",
        "error",
        "group",
        "at",
        "topic",
        "partition",
        "offset",
        "truncated",
        "value_sha256",
        "replay_of",
        "replayed",
        "replayed_to",
    }
)
"""The names (after the prefix) of the headers a dead letter, a replayed record (``replay_of``)
or a replay marker (``replayed``, ``replayed_to``) carries."""
DEAD_LETTER_REPLAY_STAGE = "replay"
"""The ``dlq_stage`` of a replay marker on the dead-letter topic (not a letter)."""
TRACEPARENT_HEADER = "traceparent"
"""W3C trace context of the span an event was appended under (only with tracing on)."""
INBOX_VERSION_HEADER = "x-inbox-version"
"""The inbox's answer header naming the version of the queue a page was built from."""

# -- traces (OpenTelemetry) ------------------------------------------------------------------

TRACER_NAME = "stepledger"
"""The OpenTelemetry tracer (instrumentation scope) of every stepledger span."""
SPANS = frozenset(
    {"stepledger.step", "stepledger.call", "stepledger.workflow.open", "stepledger.decision"}
)
"""Span names (step, call and decision spans add `` TOOL`` or `` ACTION``)."""
SPAN_ATTRIBUTES = frozenset(
    {
        "stepledger.workflow_id",
        "stepledger.step_id",
        "stepledger.tool",
        "stepledger.attempt",
        "stepledger.policy",
        "stepledger.idempotency_key",
        "stepledger.replayed",
        "stepledger.decision",
        "stepledger.event_type",
        "stepledger.status",
        "stepledger.pipelined",
    }
)
"""Attributes stepledger sets on its spans and span events."""

# -- steps the framework integrations name --------------------------------------------------

MODEL_STEP_TOOL = "model"
"""The tool name of a recorded model turn (a read-only step; ``stepledger.integrations``)."""
AUTO_STEP_ID_SEPARATOR = "#"
"""Step ids the integrations give a model's calls: tool, this separator, occurrence (from 1)."""

# -- metrics (Prometheus names, without the ``_total`` suffix of counters) ----------------------

PROJECTOR_METRICS = frozenset(
    {
        "stepledger_projector_anomalies",
        "stepledger_projector_batch_seconds",
        "stepledger_projector_broker_up",
        "stepledger_projector_commit_lag_seconds",
        "stepledger_projector_consumer_lag",
        "stepledger_projector_dead_letters",
        "stepledger_projector_duplicates",
        "stepledger_projector_events",
        "stepledger_projector_records_lost",
        "stepledger_projector_partitions_held",
        "stepledger_projector_snapshot_seconds",
        "stepledger_projector_snapshot_timestamp_seconds",
    }
)
"""What the projector daemon serves on its metrics port."""
RECOVERY_METRICS = frozenset(
    {
        "stepledger_recovery_assigned_partitions",
        "stepledger_recovery_broker_up",
        "stepledger_recovery_clock_skew_seconds",
        "stepledger_recovery_escalated_steps",
        "stepledger_recovery_escalations",
        "stepledger_recovery_events",
        "stepledger_recovery_fenced_appends",
        "stepledger_recovery_hook_errors",
        "stepledger_recovery_last_loop_timestamp_seconds",
        "stepledger_recovery_late_outcomes",
        "stepledger_recovery_lost_claims",
        "stepledger_recovery_oldest_overdue_intent_seconds",
        "stepledger_recovery_open_intents",
        "stepledger_recovery_poison_events",
        "stepledger_recovery_records_lost",
        "stepledger_recovery_resolution_latency_seconds",
        "stepledger_recovery_resolutions",
        "stepledger_recovery_tracked_steps",
    }
)
"""What the recovery daemon serves on its metrics port."""

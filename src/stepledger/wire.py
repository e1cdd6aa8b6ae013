"""Every name that leaves the process: topics, consumer groups, client ids, headers, metrics.

These names are a contract with running deployments (a default topic name is where a fleet
on defaults writes; a group id is where a daemon's committed offsets live; a metric name is
what alert rules match), so they are literals here, never derived from a Python module path
that a refactor can move.  ``tests/unit/test_wire_names.py`` pins every one of them: changing
a name is a CHANGELOG entry with an upgrade step, never a side effect of a rename.  The names
that hold one deployment's state are derived from its step log's name by one rule
(:func:`derived_name`), pinned the same way.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

# -- topics ---------------------------------------------------------------------------------

STEP_LOG_TOPIC = "stepledger.events"
"""The default step-log topic."""
STEP_LOG_TIMESTAMP_TYPE = "LogAppendTime"
"""How ``init`` has the step log's records stamped: by the broker (deadlines anchor on it)."""
CHECKPOINT_DIRECTORY_KEY = "\x00directory"
"""The record key of a checkpoint partition's directory root (no workflow id starts with NUL)."""
CHECKPOINT_DIRECTORY_CHUNK_PREFIX = "\x00directory/"
"""A directory chunk's record key: this prefix and its bucket number in decimal."""

# -- names derived from the step log ----------------------------------------------------------
#
# Every topic and consumer group that holds one deployment's state is named after its step
# log by default (invariant 21): two step logs on one cluster never share a checkpoint topic,
# a dead-letter topic, a recovery changelog or a group unless an operator names one twice,
# and one prefix (the step log's name) covers all of a deployment's topics and groups, which
# is what prefixed ACLs match.  Each name can be given instead (flags, environment, file).

DERIVED_NAME_SEPARATOR = "."
"""A derived name is the step log's name, this separator and the role (``orders.checkpoints``)."""
DEAD_LETTER_ROLE = "deadletters"
"""The dead-letter topic (undecodable or invalid input, with the reason in headers)."""
CHECKPOINT_ROLE = "checkpoints"
"""The compacted topic of workflow checkpoints (partitioned like the step log)."""
RECOVERY_STATE_ROLE = "recovery-state"
"""The compacted topic of the recovery daemons' per-partition state (their one store)."""
PROJECTOR_ROLE = "projector"
"""The projector daemons' consumer group."""
LAKE_PROJECTOR_ROLE = "lake-projector"
"""The consumer group of the projectors into a lake (``project --lake``): its own, so a
projector into a file and one into a lake on the same step log do not split its partitions."""
RECOVERY_ROLE = "recovery"
"""The recovery daemons' consumer group."""
WORKFLOW_READER_ROLE = "workflow-reader"
"""The group id of the SDK's partition reads (assigned, never joined nor committed)."""
WORKFLOW_INDEX_ROLE = "workflow-index"
"""The group id of the SDK's partition index (assigned, never joined nor committed)."""
POSITION_CHECK_ROLE = "position-check"
"""The group id of the projector's position check (assigned, never committed)."""
READER_ROLE = "reader"
"""The group id of whole-topic reads (tail, dead letters, escalations; never committed)."""
CHECKPOINTER_ROLE = "checkpointer"
"""The checkpointers' consumer group: its members split the step log's partitions (offsets
never committed: each partition's progress is on the checkpoint topic); also the group id of
a one-shot catch-up's assigned reads (``checkpoint --once``, never joined)."""
CHECKPOINT_READER_ROLE = "checkpoint-reader"
"""The group id of checkpoint-topic reads (assigned, never committed)."""
LOG_START_ROLE = "log-start"
"""The group id of the client that asks partitions' log starts and ends (never reads)."""
RECOVERY_CHANGELOG_ROLE = "recovery-changelog-reader"
"""The group id of a recovery daemon's changelog restore (assigned, never committed)."""
STATE_ADOPTION_ROLE = "state-adoption"
"""The group id of ``init --adopt-unnamed-state``'s reads of state topics (never committed)."""
BUDGET_ROLE = "budget"
"""The fleets' budget topic: one partition, keyed by fleet, whose order decides each model
turn's reservation (:mod:`stepledger.domain.fleetbudget`)."""
BUDGET_READER_ROLE = "budget-reader"
"""The group id of the budget topic's reads (assigned, never joined nor committed)."""


def derived_name(step_log: str, role: str) -> str:
    """The name of a step log's topic or group for ``role`` (one of the ``*_ROLE`` names)."""
    return f"{step_log}{DERIVED_NAME_SEPARATOR}{role}"


LOG_IDENTITY_HEADER = "stepledger_log"
"""On every state record (checkpoint, progress, directory, recovery changelog): the identity
of the step log it describes, ``<topic>@<topic id>`` (:mod:`stepledger.kafka.logid`)."""

# -- the defaults of releases up to 0.3.0 (upgrade steps, `dlq list`, `doctor`) --------------

PREVIOUS_DEAD_LETTER_TOPIC = "stepledger.deadletter"
"""The dead-letter default up to 0.3.0, for every step log."""
RENAMED_DEAD_LETTER_TOPIC = "stepledger.deadletters.letter"
"""The dead-letter default a refactor put on ``main`` by mistake; ``dlq list`` points to it."""
PREVIOUS_CHECKPOINT_TOPIC = "stepledger.checkpoints.workflow"
"""The checkpoint-topic default up to 0.3.0, shared by every step log of a cluster."""
PREVIOUS_RECOVERY_STATE_TOPIC = "stepledger.recovery.changelog"
"""The recovery-changelog default up to 0.3.0, shared by every step log of a cluster."""
PREVIOUS_PROJECTOR_GROUP = "stepledger-projector"
"""The projector group default up to 0.3.0."""
PREVIOUS_RECOVERY_GROUP = "stepledger-recovery"
"""The recovery group default up to 0.3.0."""

# -- client ids ------------------------------------------------------------------------------

RECOVERY_CLIENT_ID = "stepledger-recovery"
"""The client id (prefix) of every recovery daemon's consumer, which tells other groups' apart."""
PROJECTOR_CLIENT_ID = "stepledger-projector"
"""The client id (prefix) of every projector's consumer."""
CHECKPOINTER_CLIENT_ID = "stepledger-checkpointer"
"""The client id (prefix) of every checkpointer's group consumer."""
CLIENT_VERSION_SEPARATOR = "/"
"""A daemon's client id is its prefix, this, and the stepledger version (``stepledger doctor``)."""
CLIENT_ID_PREFIX = "stepledger-"
"""The prefix of every daemon's client id (``stepledger-ROLE/VERSION``)."""
_CLIENT_IDS = {
    "projector": PROJECTOR_CLIENT_ID,
    "recovery": RECOVERY_CLIENT_ID,
    "checkpointer": CHECKPOINTER_CLIENT_ID,
}


@functools.cache
def stepledger_version() -> str:
    """The installed package's version (``0+unknown`` when run from a bare source tree): in
    every daemon's client id and beside the application's version on every claim."""
    try:
        return version("stepledger")
    except PackageNotFoundError:
        return "0+unknown"


def client_id(role: str) -> str:
    """``stepledger-ROLE/VERSION``: the client id a daemon shows the broker (``stepledger
    doctor`` tells a group member of another version by it, a rolling upgrade left half way)."""
    prefix = _CLIENT_IDS.get(role, CLIENT_ID_PREFIX + role)
    return f"{prefix}{CLIENT_VERSION_SEPARATOR}{stepledger_version()}"


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
        "stepledger.model.cost",
        "gen_ai.response.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
    }
)
"""Attributes stepledger sets on its spans and span events (``gen_ai.*``: OpenTelemetry's
GenAI semantic conventions, on a model turn's step span)."""

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
        "stepledger_projector_model_tokens_incurred",
        "stepledger_projector_model_tokens_reused",
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

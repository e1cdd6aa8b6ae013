"""The DuckDB schema of the projection: tables, their Arrow types and the analysts' views.

Every projected table is a function of the log alone (event times, never the wall clock),
so a rebuild from offset 0 yields the same rows as the incremental build.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from stepledger.errors import ViewStoreError
from stepledger.projector.costs import MODEL_CALL_VIEWS

#: 2: ``escalations`` keyed by ``(workflow_id, escalation_id)`` (was ``escalation_id``).
#: 3: ``model_calls`` (the token ledger); an older projection gets it empty: rebuild it to
#: count the turns projected before the upgrade.
#: 4: ``steps.app_version`` and ``workflows.app_version`` (the application that ran them).
SCHEMA_VERSION = 4
#: Columns a version added at the end of a table (ALTER TABLE ADD COLUMN appends them).
_ADDED = {4: (("steps", "app_version", "VARCHAR"), ("workflows", "app_version", "VARCHAR"))}

_TS = pa.timestamp("ms", tz="UTC")

#: Arrow schema of each projected table; column order is the table's column order.
ARROW: dict[str, pa.Schema] = {
    "events": pa.schema(
        [
            ("event_id", pa.string()),
            ("workflow_id", pa.string()),
            ("step_id", pa.string()),
            ("fleet_id", pa.string()),
            ("producer_id", pa.string()),
            ("occurred_at", _TS),
            ("type", pa.string()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("log_offset", pa.int64()),
            ("value", pa.binary()),
        ]
    ),
    "steps": pa.schema(
        [
            ("workflow_id", pa.string()),
            ("step_id", pa.string()),
            ("fleet_id", pa.string()),
            ("sequence", pa.int32()),
            ("status", pa.string()),
            ("in_doubt", pa.bool_()),
            ("tool", pa.string()),
            ("effect", pa.string()),
            ("policy", pa.string()),
            ("attempt", pa.int32()),
            ("recovery_attempts", pa.int32()),
            ("idempotency_key", pa.string()),
            ("arguments_digest", pa.string()),
            ("arguments_json", pa.string()),
            ("deadline", _TS),
            ("result_json", pa.string()),
            ("error", pa.string()),
            ("resolved_by", pa.string()),
            ("escalation_id", pa.string()),
            ("escalation_open", pa.bool_()),
            ("compensation_key", pa.string()),
            ("first_at", _TS),
            ("last_at", _TS),
            ("intended_at", _TS),
            ("resolved_at", _TS),
            ("duration_ms", pa.int64()),
            ("app_version", pa.string()),
        ]
    ),
    "workflows": pa.schema(
        [
            ("workflow_id", pa.string()),
            ("fleet_id", pa.string()),
            ("name", pa.string()),
            ("status", pa.string()),
            ("attempt", pa.int32()),
            ("max_attempts", pa.int32()),
            ("read_only", pa.bool_()),
            ("escalation_id", pa.string()),
            ("started_at", _TS),
            ("last_at", _TS),
            ("steps", pa.int32()),
            ("in_doubt", pa.int32()),
            ("awaiting_approval", pa.int32()),
            ("approved", pa.int32()),
            ("denied", pa.int32()),
            ("intended", pa.int32()),
            ("succeeded", pa.int32()),
            ("failed", pa.int32()),
            ("not_happened", pa.int32()),
            ("compensating", pa.int32()),
            ("compensated", pa.int32()),
            ("compensation_failed", pa.int32()),
            ("abandoned", pa.int32()),
            ("anomalies", pa.int32()),
            ("events", pa.int32()),
            ("app_version", pa.string()),
        ]
    ),
    "escalations": pa.schema(
        [
            ("escalation_id", pa.string()),
            ("kind", pa.string()),
            ("workflow_id", pa.string()),
            ("step_id", pa.string()),
            ("fleet_id", pa.string()),
            ("reason", pa.string()),
            ("status", pa.string()),
            ("opened_at", _TS),
            ("verdict", pa.string()),
            ("resolved_by", pa.string()),
            ("note", pa.string()),
            ("resolved_at", _TS),
        ]
    ),
    "anomalies": pa.schema(
        [
            ("event_id", pa.string()),
            ("workflow_id", pa.string()),
            ("step_id", pa.string()),
            ("fleet_id", pa.string()),
            ("kind", pa.string()),
            ("detail", pa.string()),
            ("event_type", pa.string()),
            ("detected_by", pa.string()),
            ("occurred_at", _TS),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("log_offset", pa.int64()),
        ]
    ),
    # The token ledger: a model turn incurred (asked) or reused (replayed), with its usage.
    "model_calls": pa.schema(
        [
            ("event_id", pa.string()),
            ("workflow_id", pa.string()),
            ("step_id", pa.string()),
            ("fleet_id", pa.string()),
            ("kind", pa.string()),
            ("attempt", pa.int32()),
            ("model", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
            ("cost", pa.float64()),
            ("occurred_at", _TS),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("log_offset", pa.int64()),
        ]
    ),
    "offsets": pa.schema(
        [("topic", pa.string()), ("partition", pa.int32()), ("next_offset", pa.int64())]
    ),
    # History the projection never saw: the log's head was deleted before it was read.
    "gaps": pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("expected_offset", pa.int64()),
            ("log_start", pa.int64()),
            ("records_lost", pa.int64()),
            ("detected_at", _TS),
            ("detected_by", pa.string()),
        ]
    ),
}

#: Primary keys of the tables that are upserted; the others only ever grow.
KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("workflow_id", "step_id"),
    "workflows": ("workflow_id",),
    # An escalation id is a hash of its workflow's id, but the log is not trusted to keep it
    # so: two workflows naming one id must not overwrite each other's row.
    "escalations": ("workflow_id", "escalation_id"),
    "offsets": ("topic", "partition"),
    "gaps": ("topic", "partition", "expected_offset"),
    "model_calls": ("workflow_id", "event_id"),
}

#: The projected tables, in the order a batch writes them (offsets last).
TABLES: tuple[str, ...] = (
    "events",
    "steps",
    "workflows",
    "escalations",
    "anomalies",
    "model_calls",
    "gaps",
    "offsets",
)
VIEWS: tuple[str, ...] = (
    "open_intents",
    "unresolved_escalations",
    "tool_stats",
    "fleet_summary",
    *MODEL_CALL_VIEWS,
)

_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.bool_(): "BOOLEAN",
    pa.binary(): "BLOB",
    pa.float64(): "DOUBLE",
    _TS: "TIMESTAMPTZ",
}

_VIEW_SQL = {
    "open_intents": """
        SELECT workflow_id, step_id, fleet_id, tool, effect, policy, attempt,
               recovery_attempts, idempotency_key, intended_at, deadline,
               now() - intended_at AS age, now() > deadline AS past_deadline
        FROM steps WHERE in_doubt""",
    "unresolved_escalations": """
        SELECT escalation_id, kind, workflow_id, step_id, fleet_id, reason, opened_at,
               now() - opened_at AS age
        FROM escalations WHERE status = 'open'""",
    "tool_stats": """
        SELECT tool,
               count(*) AS steps,
               count(*) FILTER (status = 'succeeded') AS succeeded,
               count(*) FILTER (status = 'failed') AS failed,
               count(*) FILTER (status = 'not_happened') AS not_happened,
               count(*) FILTER (in_doubt) AS in_doubt,
               count(*) FILTER (status = 'compensated') AS compensated,
               count(*) FILTER (status = 'abandoned') AS abandoned,
               sum(attempt) AS attempts,
               count(*) FILTER (attempt > 1) AS retried,
               count(*) FILTER (status = 'succeeded')
                 / nullif(count(*) FILTER (status IN ('succeeded', 'failed', 'not_happened')), 0)
                 AS success_rate,
               quantile_cont(duration_ms, 0.5) FILTER (resolved_by = 'agent') AS p50_ms,
               quantile_cont(duration_ms, 0.95) FILTER (resolved_by = 'agent') AS p95_ms,
               count(*) FILTER (compensation_key IS NOT NULL) / count(*) AS compensation_rate
        FROM steps WHERE tool <> '' GROUP BY tool""",
    "fleet_summary": """
        SELECT w.fleet_id,
               count(*) AS workflows,
               count(*) FILTER (w.status = 'running') AS running,
               count(*) FILTER (w.status = 'completed') AS completed,
               count(*) FILTER (w.status = 'failed') AS failed,
               count(*) FILTER (w.status = 'compensated') AS compensated,
               count(*) FILTER (w.status = 'compensation_incomplete') AS compensation_incomplete,
               count(*) FILTER (w.status = 'dead_lettered') AS dead_lettered,
               sum(w.steps) AS steps,
               sum(w.in_doubt) AS in_doubt,
               sum(w.anomalies) AS anomalies,
               (SELECT count(*) FROM escalations e
                 WHERE e.fleet_id = w.fleet_id AND e.status = 'open') AS open_escalations,
               min(w.started_at) AS first_started_at,
               max(w.last_at) AS last_activity_at
        FROM workflows w GROUP BY w.fleet_id""",
    **MODEL_CALL_VIEWS,
}


def columns_sql(table: str) -> list[str]:
    """The column definitions of one projected table (``"name" TYPE``), in order."""
    return [f'"{f.name}" {_DUCK_TYPES[f.type]}' for f in ARROW[table]]


def view_sql() -> dict[str, str]:
    """The analysts' views over the projected tables, by name (their SELECT statements)."""
    return dict(_VIEW_SQL)


def table_ddl(table: str) -> str:
    """Return the CREATE TABLE statement of one projected table."""
    columns = columns_sql(table)
    if table in KEYS:
        columns.append("PRIMARY KEY (" + ", ".join(f'"{k}"' for k in KEYS[table]) + ")")
    return f"CREATE TABLE IF NOT EXISTS {table} (" + ", ".join(columns) + ")"


def create_schema(con: Any) -> None:
    """Create every table, index and view that does not exist yet (idempotent).

    A projection written by an older stepledger is migrated in place (in one transaction);
    one written by a newer one is refused, since this code cannot know its tables.
    """
    con.execute(
        "CREATE TABLE IF NOT EXISTS projector_meta (key VARCHAR PRIMARY KEY, value VARCHAR)"
    )
    found = con.execute("SELECT value FROM projector_meta WHERE key = 'schema_version'").fetchone()
    version = _version(found[0]) if found else None
    if version is not None and version > SCHEMA_VERSION:
        raise ViewStoreError(
            f"the projection has schema version {version}, newer than this stepledger's "
            f"{SCHEMA_VERSION}: upgrade stepledger or rebuild the projection"
        )
    if version is not None and version < 2:
        _migrate_escalations_key(con)
    for table in TABLES:
        con.execute(table_ddl(table))
    for added, columns in _ADDED.items():
        if version is not None and version < added:
            for table, column, kind in columns:
                con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{column}" {kind}')
    # Resume and `status` read one workflow's events; an ART index keeps that a point lookup.
    con.execute("CREATE INDEX IF NOT EXISTS events_workflow ON events (workflow_id)")
    con.execute(
        "INSERT OR REPLACE INTO projector_meta VALUES ('schema_version', ?)",
        [str(SCHEMA_VERSION)],
    )
    for view, sql in _VIEW_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {view} AS {sql}")


def _version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ViewStoreError(
            f"the projection's schema version {value!r} is not a number: rebuild the projection"
        ) from None


def _migrate_escalations_key(con: Any) -> None:
    """Version 1 -> 2: re-key ``escalations`` by ``(workflow_id, escalation_id)``.

    DuckDB cannot alter a primary key, so the rows move to a new table (same columns).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(table_ddl("escalations").replace(" escalations (", " escalations_v2 (", 1))
        con.execute("INSERT INTO escalations_v2 SELECT * FROM escalations")
        con.execute("DROP TABLE escalations CASCADE")
        con.execute("ALTER TABLE escalations_v2 RENAME TO escalations")
        con.execute("UPDATE projector_meta SET value = '2' WHERE key = 'schema_version'")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise

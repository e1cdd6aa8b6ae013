"""Prometheus metrics of the recovery daemon (its own registry, served on loopback)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stepledger.daemon.health import Health
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.domain.tools import Tool
from stepledger.resolution.resolver import Resolution

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800)


class RecoveryMetrics:
    """Open intents, resolutions by policy and result, escalations, hook errors, latency."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        #: What /healthz and /readyz answer (stepledger.daemon.health), served beside the metrics.
        self.health = Health("recovery")
        r = self.registry
        self.open_intents = Gauge(
            "stepledger_recovery_open_intents", "Steps in doubt the daemon holds.", registry=r
        )
        self.oldest_overdue = Gauge(
            "stepledger_recovery_oldest_overdue_intent_seconds",
            "How long the most overdue in-doubt step is past its deadline (alert on it).",
            registry=r,
        )
        self.clock_skew = Gauge(
            "stepledger_recovery_clock_skew_seconds",
            "The largest producer clock skew against this daemon's (signed; deadlines are "
            "re-anchored on this daemon's clock; NaN until an intent was read as it came).",
            registry=r,
        )
        # Unknown is not zero: a skew alert must neither fire nor read "in sync" before the
        # daemon read an intent the moment it was appended.
        self.clock_skew.set(math.nan)
        self.tracked_steps = Gauge(
            "stepledger_recovery_tracked_steps", "Steps held in memory.", registry=r
        )
        self.escalated_steps = Gauge(
            "stepledger_recovery_escalated_steps", "Tracked steps waiting for a human.", registry=r
        )
        self.partitions = Gauge(
            "stepledger_recovery_assigned_partitions", "Partitions this daemon owns.", registry=r
        )
        self.resolutions = Counter(
            "stepledger_recovery_resolutions",
            "Resolution decisions by policy and result.",
            ["policy", "result"],
            registry=r,
        )
        self.escalations = Counter(
            "stepledger_recovery_escalations", "Steps put in the human queue.", ["kind"], registry=r
        )
        self.records_lost = Counter(
            "stepledger_recovery_records_lost",
            "Records deleted from the log (retention, DeleteRecords) before recovery read them.",
            ["topic", "partition"],
            registry=r,
        )
        self.hook_errors = Counter(
            "stepledger_recovery_hook_errors",
            "Recovery hooks that raised or timed out.",
            ["tool", "policy"],
            registry=r,
        )
        self.late_outcomes = Counter(
            "stepledger_recovery_late_outcomes",
            "Outcomes that arrived after a decision, by verdict.",
            ["verdict"],
            registry=r,
        )
        self.latency = Histogram(
            "stepledger_recovery_resolution_latency_seconds",
            "From an intent's deadline to recovery's decision.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.events = Counter("stepledger_recovery_events", "Events read from the log.", registry=r)
        self.poison = Counter(
            "stepledger_recovery_poison_events",
            "Events or checkpoint entries skipped because they could not be tracked.",
            registry=r,
        )
        self.lost_claims = Counter(
            "stepledger_recovery_lost_claims",
            "Compensations not run because another decision came first in the log.",
            registry=r,
        )
        self.fenced = Counter(
            "stepledger_recovery_fenced_appends",
            "Decisions not appended because the daemon could not be sure it owned the partition.",
            registry=r,
        )
        self.broker_up = Gauge(
            "stepledger_recovery_broker_up",
            "1 while the broker answers, 0 during an outage.",
            registry=r,
        )
        self.last_loop = Gauge(
            "stepledger_recovery_last_loop_timestamp_seconds",
            "When the daemon's loop last ran (for liveness).",
            registry=r,
        )

    def observe(self, resolution: Resolution, tool: Tool | None) -> None:
        """Count one resolution's decisions (called by the resolver)."""
        policy = resolution.action.kind.value
        if resolution.error is not None:
            self.hook_errors.labels(tool=tool.name if tool else "?", policy=policy).inc()
            self.resolutions.labels(policy=policy, result="error").inc()
        for event in resolution.events:
            result = _result(event)
            if result is None:
                continue
            self.resolutions.labels(policy=policy, result=result).inc()
            if isinstance(event.body, ev.StepAbandoned):
                self.escalations.labels(kind=resolution.action.escalation or "conflict").inc()
            deadline = resolution.step.deadline
            decisive = ev.StepOutcome | ev.StepAbandoned | ev.CompensationOutcome
            if deadline is not None and isinstance(event.body, decisive):
                self.latency.observe(max(0.0, (event.occurred_at - deadline).total_seconds()))


def _result(event: ev.Event) -> str | None:
    body = event.body
    if isinstance(body, ev.StepOutcome) and body.source is not Source.AGENT:
        return body.status.value
    if isinstance(body, ev.CompensationOutcome):
        return f"compensation_{body.status.value}"
    if isinstance(body, ev.StepAbandoned):
        return "escalated"
    return None

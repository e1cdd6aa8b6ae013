"""Prometheus metrics of the projector, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stepledger.daemon.health import Health
from stepledger.projector.engine import BatchReport


class ProjectorMetrics:
    """Events projected, batch latency, consumer lag, dead letters, anomalies, snapshot age."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        #: What /healthz and /readyz answer (stepledger.daemon.health), served beside the metrics.
        self.health = Health("projector")
        r = self.registry
        self.events = Counter("stepledger_projector_events", "New events projected.", registry=r)
        self.broker_up = Gauge(
            "stepledger_projector_broker_up",
            "1 while the broker answers, 0 during an outage.",
            registry=r,
        )
        self.duplicates = Counter(
            "stepledger_projector_duplicates",
            "Redelivered or duplicate events ignored.",
            registry=r,
        )
        self.dead_letters = Counter(
            "stepledger_projector_dead_letters",
            "Records sent to the dead-letter topic.",
            ["stage"],
            registry=r,
        )
        self.anomalies = Counter(
            "stepledger_projector_anomalies", "Invalid transitions recorded.", registry=r
        )
        self.records_lost = Counter(
            "stepledger_projector_records_lost",
            "Records deleted from the log (retention, DeleteRecords) before they were projected.",
            ["topic", "partition"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "stepledger_projector_batch_seconds",
            "Time to project one batch (decode, fold, dead letters, commit).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.lag = Gauge(
            "stepledger_projector_consumer_lag",
            "Records in the partition not yet projected.",
            ["topic", "partition"],
            registry=r,
        )
        self.commit_lag = Histogram(
            "stepledger_projector_commit_lag_seconds",
            "From the oldest event of a batch (its occurred_at) to the batch's commit.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=r,
        )
        self.partitions_held = Gauge(
            "stepledger_projector_partitions_held",
            "Assigned partitions not projected: their shard is still locked by a previous owner.",
            registry=r,
        )
        self.tokens = {
            kind: Counter(
                f"stepledger_projector_model_tokens_{kind}",
                f"Input and output tokens of model turns {kind} (reused: replayed, not spent).",
                ["fleet", "model"],
                registry=r,
            )
            for kind in ("incurred", "reused")
        }
        self.snapshot_time = Gauge(
            "stepledger_projector_snapshot_timestamp_seconds",
            "Unix time the last snapshot was published.",
            registry=r,
        )
        self.snapshot_seconds = Histogram(
            "stepledger_projector_snapshot_seconds",
            "Time to publish one snapshot (a checkpoint and a copy of the file).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )

    def published(self, seconds: float) -> None:
        """Count one snapshot published, and what it took."""
        self.snapshot_time.set_to_current_time()
        self.snapshot_seconds.observe(seconds)

    def record(self, report: BatchReport, seconds: float) -> None:
        """Count one batch."""
        self.events.inc(report.projected)
        self.duplicates.inc(report.duplicates)
        self.anomalies.inc(report.anomalies)
        for stage, count in report.dead_letters.items():
            self.dead_letters.labels(stage=stage).inc(count)
        for (fleet, model, kind), tokens in report.tokens.items():
            self.tokens[kind].labels(fleet=fleet, model=model).inc(tokens)
        self.batch_seconds.observe(seconds)
        if report.lag_s is not None:
            self.commit_lag.observe(max(0.0, report.lag_s))

"""Projector vs a raw pipeline on the same records, same broker, same run.

- Throughput: the projector daemon (consumer group, decode + validate, the domain fold,
  events/steps/workflows/escalations/anomalies/offsets in one transaction per batch,
  snapshots every 2 s) vs a minimal raw pipeline written here: assign, consume, fastavro
  decode, one Arrow insert of the same event rows per batch.  Target >= 0.5.
- Lag at a steady 5k events/s into a ``stepledger project`` process (default settings):
  produce time (``occurred_at``) to committed in DuckDB (each batch's oldest event, i.e. the
  worst of the batch, from its log line) and to visible in the published snapshot an
  analyst queries (polled every 50 ms).

``python -m bench.projector [--quick] [--bootstrap HOST:PORT]``
"""

from __future__ import annotations

import gc
import io
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import fastavro
import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import Row, broker, cli, fresh_settings, percentile, produce_bulk
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.daemon.process import Shutdown
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, WorkflowStatus
from stepledger.domain.factory import Clock, EventFactory
from stepledger.domain.tools import Tool
from stepledger.kafka import topic_partitions
from stepledger.kafka.consumer import FAST_CONSUMER
from stepledger.projector.daemon import ProjectorOptions, run_projector
from stepledger.projector.engine import BatchReport
from stepledger.projector.metrics import ProjectorMetrics
from stepledger.projector.snapshot import latest_snapshot
from stepledger.projector.store import CHECKPOINT_THRESHOLD, DEFAULT_MEMORY_LIMIT

TOOLS = (
    Tool(name="charge", effect="idempotent", keyed=True),
    Tool(name="lookup", effect="read_only"),
    Tool(name="email", effect="idempotent", keyed=True),
)
STEPS = 5
CONCURRENT = 500
ARGS = {"amount": 1250, "currency": "EUR", "customer": "cus_0001", "memo": "x" * 40}


class _Ticks:
    """A fixed-step clock, so generating a million events does not read the wall clock."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()

    def __call__(self) -> datetime:
        self.now += 0.0005
        return datetime.fromtimestamp(self.now, UTC)


def workload(n: int, clock: Clock | None = None) -> list[tuple[bytes, bytes]]:
    """n encoded events: waves of 500 concurrent workflows, 5 steps each, interleaved."""
    return list(workload_stream(n, clock))


def workload_stream(n: int, clock: Clock | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The events of :func:`workload`, one at a time (10M of them do not fit in memory)."""
    codec, factory = Codec(), EventFactory("bench", "bench", clock or _Ticks())
    per_workflow = 2 + 2 * STEPS
    made = 0
    wave = 0
    while made < n:
        ids = [f"wf-{wave}-{i}" for i in range(CONCURRENT)]
        for phase in range(per_workflow):
            for wf in ids:
                if made >= n:
                    return
                yield wf.encode(), codec.encode(_event(factory, wf, phase))
                made += 1
        wave += 1


def _event(factory: EventFactory, wf: str, phase: int) -> ev.Event:
    if phase == 0:
        return factory.workflow_started(
            wf, name="bench", attempt=1, read_only=False, max_attempts=5
        )
    if phase == 1 + 2 * STEPS:
        return factory.envelope(wf, None, ev.WorkflowFinished(status=WorkflowStatus.COMPLETED))
    step, is_outcome = divmod(phase - 1, 2)
    tool = TOOLS[step % len(TOOLS)]
    if not is_outcome:
        return factory.intent(wf, f"s{step}", tool, ARGS, sequence=step)
    return factory.outcome(
        wf, f"s{step}", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"ok": step}
    )


#: The projector's DuckDB settings, given to the raw baseline too so neither side pays for
#: checkpoints or memory the other is spared (DuckDB's default checkpoints every 16 MB of WAL).
DUCKDB_SETTINGS = (
    f"checkpoint_threshold={CHECKPOINT_THRESHOLD}, memory_limit={DEFAULT_MEMORY_LIMIT}"
)


def raw_pipeline(settings: Settings, db: Path, n: int) -> float:
    """Events/s: consume from offset 0, fastavro-decode, one Arrow insert per 10k batch."""
    con = duckdb.connect(str(db), config={"memory_limit": DEFAULT_MEMORY_LIMIT})
    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    con.execute(
        "CREATE TABLE events (event_id VARCHAR, workflow_id VARCHAR, step_id VARCHAR, "
        "fleet_id VARCHAR, producer_id VARCHAR, occurred_at TIMESTAMPTZ, type VARCHAR, "
        "topic VARCHAR, partition INTEGER, log_offset BIGINT, value BLOB)"
    )
    schema = Codec().schema
    consumer = Consumer(settings.client_config(**{**FAST_CONSUMER, "group.id": "raw"}))
    parts = topic_partitions(settings, settings.topic)
    consumer.assign([TopicPartition(settings.topic, p, 0) for p in parts])
    done, start = 0, time.perf_counter()
    while done < n:
        cols: dict[str, list[Any]] = {k: [] for k in _RAW_COLUMNS}
        for msg in consumer.consume(10_000, 0.5):
            if msg.error() is not None:
                continue
            value = msg.value() or b""
            r: Any = fastavro.schemaless_reader(
                io.BytesIO(value[10:]), schema, None, return_record_name=True
            )
            for name in (
                "event_id",
                "workflow_id",
                "step_id",
                "fleet_id",
                "producer_id",
                "occurred_at",
            ):
                cols[name].append(r[name])
            cols["type"].append(r["body"][0])
            cols["topic"].append(msg.topic())
            cols["partition"].append(msg.partition())
            cols["log_offset"].append(msg.offset())
            cols["value"].append(value)
        if cols["value"]:
            con.register("batch", pa.table(cols))
            con.execute("INSERT INTO events SELECT * FROM batch")
            con.unregister("batch")
            done += len(cols["value"])
    elapsed = time.perf_counter() - start
    consumer.close()
    con.close()
    return n / elapsed


_RAW_COLUMNS = (
    "event_id",
    "workflow_id",
    "step_id",
    "fleet_id",
    "producer_id",
    "occurred_at",
    "type",
    "topic",
    "partition",
    "log_offset",
    "value",
)


def projector_rate(
    settings: Settings,
    db: Path,
    n: int,
    options: ProjectorOptions | None = None,
    reports: list[BatchReport] | None = None,
) -> tuple[float, float, float, float]:
    """(events/s from the start of the first batch to the end of the last, seconds to the
    end of the first, snapshots published and the seconds they took, the one at stop too).

    The first batch counts from when it began (its report's ``seconds`` before it ended):
    the projector commits a poll of every partition as one batch, so 10,000 events can be
    a single batch, which a window starting at the end of the first batch cannot measure.
    """
    shutdown = Shutdown()
    marks: list[tuple[float, int]] = []  # (time a batch ended, records so far)
    began: list[float] = []

    def on_batch(report: BatchReport) -> None:
        now = time.perf_counter()
        if reports is not None:
            reports.append(report)
        if not began:
            began.append(now - report.seconds)
        done = (marks[-1][1] if marks else 0) + report.received
        marks.append((now, done))
        if done >= n:
            shutdown.request()

    options = options or ProjectorOptions(db_path=db, group="bench-projector")
    metrics = ProjectorMetrics()
    start = time.perf_counter()
    run_projector(settings, options, shutdown=shutdown, on_batch=on_batch, metrics=metrics)
    first_at, (last_at, last_done) = marks[0][0], marks[-1]
    value = metrics.registry.get_sample_value
    snapshots = value("stepledger_projector_snapshot_seconds_count") or 0.0
    took = value("stepledger_projector_snapshot_seconds_sum") or 0.0
    return last_done / (last_at - began[0]), first_at - start, snapshots, took


def steady_lag(
    settings: Settings, db: Path, rate: int, seconds: float
) -> tuple[list[float], list[float]]:
    """Produce at a steady rate into a ``stepledger project`` process.

    Returns (commit lags from its per-batch log lines, snapshot-visible lags) in seconds.
    """
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepledger",
            "project",
            "--bootstrap",
            settings.bootstrap,
            "--topic",
            settings.topic,
            "--dlq-topic",
            settings.dlq_topic,
            "--db",
            str(db),
            "--group",
            "bench-lag",
            "--log-format",
            "json",
            "--log-level",
            "DEBUG",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    commit_lags: list[float] = []
    reader = threading.Thread(target=_read_lags, args=(daemon, commit_lags), daemon=True)
    reader.start()
    stop = Shutdown()
    try:
        # Lag is measured once the group is joined: one warm-up event must be committed first.
        _produce_steadily(settings, rate, 1 / rate, [], prefix="warm")
        _wait_for(lambda: bool(commit_lags), 60)
        commit_lags.clear()
        produced: list[float] = []
        visible: list[float] = []
        poller = threading.Thread(target=_poll_snapshot, args=(db, produced, visible, stop))
        poller.start()
        _produce_steadily(settings, rate, seconds, produced)
        _wait_for(lambda: len(visible) >= len(produced), 30)
        stop.request()
        poller.join(10)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    return commit_lags, [v - p for p, v in zip(produced, visible, strict=False)]


def _read_lags(daemon: subprocess.Popen[str], lags: list[float]) -> None:
    assert daemon.stderr is not None
    for line in daemon.stderr:
        if line.startswith("{") and '"lag_s"' in line:
            lag = json.loads(line).get("lag_s")
            if lag is not None:
                lags.append(float(lag))


def _produce_steadily(
    settings: Settings, rate: int, seconds: float, produced: list[float], prefix: str = "lag"
) -> None:
    codec, factory = Codec(), EventFactory("bench", "bench")
    producer = Producer(settings.client_config(**{"linger.ms": 2, "acks": "all"}))
    total = int(rate * seconds)
    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(0.001, due - now))
        wf = f"{prefix}-{i // 12}"
        event = _event(factory, wf, i % 12)
        producer.produce(settings.topic, codec.encode(event), wf.encode())
        produced.append(event.occurred_at.timestamp())
        producer.poll(0)
    producer.flush(30)


_VISIBLE = "SELECT count(*) FROM events WHERE workflow_id LIKE 'lag-%'"


def _poll_snapshot(db: Path, produced: list[float], visible: list[float], stop: Shutdown) -> None:
    """Record, for each produced event in order, when a snapshot first showed it."""
    deadline = time.monotonic() + 300
    while not stop.requested and time.monotonic() < deadline:
        snap = latest_snapshot(db)
        count = None if snap is None else _count_visible(snap)
        if count is not None:
            now = time.time()
            while count is not None and len(visible) < min(count[0], len(produced)):
                visible.append(now)
        stop.wait(0.05)


def _count_visible(snap: Path) -> tuple[Any, ...] | None:
    # The projector replaces its snapshot atomically: the path just listed may be gone.
    try:
        con = duckdb.connect(str(snap), read_only=True)
    except duckdb.Error:
        return None
    try:
        return con.execute(_VISIBLE).fetchone()
    except duckdb.Error:
        return None
    finally:
        con.close()


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("bench condition not reached")
        time.sleep(0.02)


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Measure throughput on 1M events (10k quick) and lag at 5k events/s."""
    n, lag_seconds = (10_000, 1.5) if quick else (1_000_000, 10.0)
    gc.collect()
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        settings = fresh_settings(servers)
        records = workload(n)
        produce_bulk(settings, records)
        del records
        # The raw baseline runs before and after, so load that changes during the run
        # weighs on both sides of the ratio.
        raw_before = raw_pipeline(settings, Path(tmp) / "raw1.duckdb", n)
        rate, join, snapshots, took = projector_rate(settings, Path(tmp) / "projection.duckdb", n)
        raw = (raw_before + raw_pipeline(settings, Path(tmp) / "raw2.duckdb", n)) / 2
        commit, visible = steady_lag(
            fresh_settings(servers), Path(tmp) / "lag.duckdb", 5000, lag_seconds
        )
    ms = 1000.0
    return [
        Row(
            "projector",
            f"events/s on {n:,} events (vs raw consume+decode+insert; both DuckDB "
            f"{DUCKDB_SETTINGS})",
            rate,
            raw,
            "events/s",
            ">=0.5",
        ),
        Row("projector", "group join to first batch", join, None, "s", "", False),
        Row("projector", "snapshots published in that run", snapshots, None, "", "", False),
        Row("projector", "time those snapshots took", took, None, "s", "", False),
        Row(
            "projector",
            "lag at 5k/s: produce to committed, p50",
            percentile(commit, 50) * ms,
            None,
            "ms",
            "",
            False,
        ),
        Row(
            "projector",
            "lag at 5k/s: produce to committed, p95",
            percentile(commit, 95) * ms,
            None,
            "ms",
            "",
            False,
        ),
        Row(
            "projector",
            "lag at 5k/s: produce to snapshot-visible, p50",
            percentile(visible, 50) * ms,
            None,
            "ms",
            "",
            False,
        ),
        Row(
            "projector",
            "lag at 5k/s: produce to snapshot-visible, p95",
            percentile(visible, 95) * ms,
            None,
            "ms",
            "",
            False,
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

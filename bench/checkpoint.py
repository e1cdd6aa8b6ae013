"""Checkpoints on compacted topics: resume from checkpoint plus tail, a new recovery owner, size.

- Resume: a step log of 10k, 100k and 1M events (quick: 1k and 4k) in 3 partitions, holding
  finished workflows of 10 steps and one unfinished target whose first 7 steps are written
  before the checkpointer runs and its last 3 after (with a tail of other workflows).  The
  checkpointer (``Checkpointer.catch_up``, what ``stepledger checkpoint --once`` runs) folds
  the log into the checkpoint topic; then the head of every partition, up to the offset the
  checkpointer's progress covers, is deleted (``DeleteRecords``, what retention does) and a
  fresh ``Ledger`` opens the target: the checkpoint topic for the history, then the step
  log's tail after it.  Raw baseline, same log, same run: the same open before the head was
  deleted, which reads the target's whole partition (the checkpoint is not consulted while
  the partition starts at offset 0).  Median of 5 opens (quick: 2).  Target < 100 ms and
  flat in the log's size.
- Recovery: a partition handed to a new recovery daemon (its state on the changelog topic)
  on a fresh, empty state directory: assigned to caught up,
  against the first daemon's replay of the log from offset 0.
- Size: the checkpoint topic's bytes per workflow of 10 steps (key + value of each key's
  newest record: what compaction keeps), next to the step log's bytes per workflow.

Needs a broker that deletes records on request (Apache Kafka: ``--engine kafka``); on one
that does not (Tansu) the deleted-head rows are left out and the bench says so.

``python -m bench.checkpoint [--quick] [--engine kafka] [--sizes 10000,100000]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bench.common import Row, broker, fill_log, produce_bulk, run_broker, table
from bench.recovery import FAST_FETCH, Running, bench_tool, open_intents, settled_history
from stepledger.checkpoints.directory import is_directory_key
from stepledger.checkpoints.record import encode
from stepledger.checkpoints.view import CheckpointView
from stepledger.checkpoints.writer import Checkpointer
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, WorkflowStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.kafka import admin, ensure_topics, topic_partitions
from stepledger.kafka.consumer import FAST_CONSUMER
from stepledger.kafka.topics import COMPACTED, checkpoint_topic_config, step_log_config
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry

TOOL = Tool(name="charge", effect="idempotent", keyed=True)
STEPS = 10
#: workflow_started, an intent and an outcome per step, workflow_finished.
EVENTS_PER_WORKFLOW = 2 + 2 * STEPS
TARGET = "wf-checkpointed"
#: The target's steps written before the checkpointer runs; the rest are in the tail.
BEFORE = 7
PARTITIONS = 3
TAIL = 1_000
REPEATS = 5


def topic_settings(bootstrap: str) -> Settings:
    """A new step log (kept forever), its checkpoint topic and recovery changelog."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        bootstrap=bootstrap,
        topic=topic,
        producer_id="bench",
        checkpoint_topic=f"{topic}-checkpoints",
        recovery_state_topic=f"{topic}-recovery",
    )
    ensure_topics(
        settings,
        [settings.topic, settings.dlq_topic, settings.checkpoint_topic],
        partitions=PARTITIONS,
        configs={
            settings.topic: step_log_config(checkpoints=True),
            settings.checkpoint_topic: checkpoint_topic_config(),
        },
    )
    return settings


def workflow_events(
    factory: EventFactory, workflow_id: str, steps: range, *, started: bool, finished: bool
) -> list[ev.Event]:
    """A workflow's events: optionally its start, the given steps, optionally its finish."""
    events: list[ev.Event] = []
    if started:
        events.append(
            factory.workflow_started(
                workflow_id, name="bench", attempt=1, read_only=False, max_attempts=10_000
            )
        )
    for s in steps:
        args = {"amount": 100 + s, "customer": workflow_id, "memo": "x" * 60}
        events.append(factory.intent(workflow_id, f"s{s}", TOOL, args, sequence=s))
        done = OutcomeStatus.SUCCEEDED
        events.append(factory.outcome(workflow_id, f"s{s}", attempt=1, status=done, result=s))
    if finished:
        body = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED)
        events.append(factory.envelope(workflow_id, None, body))
    return events


def finished_workflow(factory: EventFactory, workflow_id: str) -> list[ev.Event]:
    """A finished workflow of ``STEPS`` steps (what the log is filled with)."""
    return workflow_events(factory, workflow_id, range(STEPS), started=True, finished=True)


def fill(settings: Settings, events: int, prefix: str, workers: int = 2) -> int:
    """About ``events`` events of finished 10-step workflows, from worker processes."""
    return fill_log(settings, events, prefix, finished_workflow, EVENTS_PER_WORKFLOW, workers)


def append_target(settings: Settings, steps: range, *, started: bool) -> None:
    """Append the target's events (unfinished) through the SDK's log."""
    with Ledger(settings) as ledger:
        for event in workflow_events(ledger.events, TARGET, steps, started=started, finished=False):
            ledger.log.append(event)


def open_once(settings: Settings) -> float:
    """Seconds for a fresh ``Ledger`` (what a new process builds) to open the target."""
    began = time.perf_counter()
    with Ledger(settings) as ledger:
        wf = ledger.workflow(TARGET)
        elapsed = time.perf_counter() - began
        assert wf.attempt >= 2 and len(wf.state.steps) == STEPS, (wf.attempt, wf.state.steps)
    return elapsed


def median_open(settings: Settings, repeats: int) -> float:
    """The median of ``repeats`` opens, after one untimed open."""
    open_once(settings)
    return statistics.median(open_once(settings) for _ in range(repeats))


def warm_open(settings: Settings, repeats: int) -> float:
    """The median open in one ``Ledger`` that opened the target before (an agent process
    resuming many workflows): its index and checkpoint view read only what is new."""
    with Ledger(settings) as ledger:
        ledger.workflow(TARGET)
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            wf = ledger.workflow(TARGET)
            times.append(time.perf_counter() - began)
            assert len(wf.state.steps) == STEPS
    return statistics.median(times)


def view_read(settings: Settings, repeats: int) -> tuple[float, int, int]:
    """A fresh checkpoint view's read of the target's partition: median s, records, bytes."""
    from stepledger.kafka.partitioner import configured, partition_of

    count = len(topic_partitions(settings, settings.topic))
    home = partition_of(TARGET.encode(), count, configured(settings.client_config()))
    assert home is not None
    times = []
    for _ in range(repeats):
        view = CheckpointView(settings)
        began = time.perf_counter()
        assert view.lookup(home, TARGET).checkpoint is not None
        times.append(time.perf_counter() - began)
    held = view.partition(home)
    return statistics.median(times), len(held), sum(len(encode(c)) for c in held.values())


def delete_covered_head(settings: Settings) -> dict[int, int] | None:
    """Delete each partition's records the checkpointer's progress covers; the new starts.

    None when the broker does not delete records on request.
    """
    view = CheckpointView(settings)
    wanted = []
    for partition in topic_partitions(settings, settings.topic):
        progress = view.lookup(partition, TARGET).progress
        if progress is not None and progress >= 0:
            wanted.append(TopicPartition(settings.topic, partition, progress + 1))
    client = admin(settings)  # kept referenced until the futures are done
    try:
        futures = client.delete_records(wanted, request_timeout=30)
        return {tp.partition: int(f.result(30).low_watermark) for tp, f in futures.items()}
    except KafkaException as exc:
        print(f"[checkpoint] the broker did not delete records ({exc}): rows left out")
        return None


@dataclass(frozen=True)
class Sized:
    """One size's figures (seconds, except where named)."""

    events: int
    fill_s: float
    checkpointer_s: float
    full_partition: float
    from_checkpoint: float | None
    deleted: int
    warm: float | None = None
    view_s: float = 0.0
    view_records: int = 0
    view_bytes: int = 0
    held_bytes: int = 0


def resume_at(bootstrap: str, events: int, repeats: int, tail: int) -> tuple[Settings, Sized]:
    """Prepare one log of ``events`` events, checkpoint it, time both opens."""
    settings = topic_settings(bootstrap)
    began = time.perf_counter()
    written = fill(settings, events // 2, "a")
    append_target(settings, range(BEFORE), started=True)
    written += fill(settings, events - written, "b")
    fill_s = time.perf_counter() - began
    began = time.perf_counter()
    checkpointer = Checkpointer(settings)
    try:
        checkpointer.catch_up(timeout_s=3600)
        held = checkpointer.held_bytes
    finally:
        checkpointer.close()
    checkpointer_s = time.perf_counter() - began
    fill(settings, tail, "tail", workers=1)
    append_target(settings, range(BEFORE, STEPS), started=False)
    full = median_open(settings, repeats)
    starts = delete_covered_head(settings)
    cut = warm = None
    if starts is not None:
        cut, warm = median_open(settings, repeats), warm_open(settings, repeats)
    view_s, view_records, view_bytes = view_read(settings, repeats)
    figures = Sized(
        written,
        fill_s,
        checkpointer_s,
        full,
        cut,
        sum((starts or {}).values()),
        warm,
        view_s,
        view_records,
        view_bytes,
        held,
    )
    print(
        f"[checkpoint] {written:,} events: fill {fill_s:.1f}s, checkpointer {checkpointer_s:.1f}s;"
        f" open from the whole partition {full * 1000:.0f} ms, from checkpoint + tail "
        + ("n/a" if cut is None else f"{cut * 1000:.0f} ms")
        + f" ({figures.deleted:,} records deleted); warm "
        + ("n/a" if warm is None else f"{warm * 1000:.0f} ms")
        + f"; checkpoint view read {view_s * 1000:.0f} ms, {view_records:,} records, "
        f"{view_bytes / 1e6:.1f} MB",
        flush=True,
    )
    return settings, figures


def _newest(settings: Settings, topic: str) -> tuple[dict[tuple[int, bytes], int], int, int]:
    """Per partition and key the size of its newest record (key + value + headers), all
    bytes, records (a directory's keys repeat in every partition)."""
    partitions = topic_partitions(settings, topic)
    consumer = Consumer(
        settings.client_config(**{**FAST_CONSUMER, "group.id": "bench-size", **FAST_FETCH})
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    newest: dict[tuple[int, bytes], int] = {}
    total = records = 0
    done: set[int] = set()
    deadline = time.monotonic() + 600
    try:
        while len(done) < len(partitions) and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.05):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(int(msg.partition() or 0))
                    continue
                key, value = msg.key() or b"", msg.value() or b""
                pairs = msg.headers() or []
                items = pairs.items() if isinstance(pairs, dict) else pairs
                headers = sum(len(name) + len(v or b"") for name, v in items)
                size = len(key) + len(value) + headers
                newest[(int(msg.partition() or 0), key)] = size
                total += size
                records += 1
    finally:
        consumer.close()
    return newest, total, records


def sizes_per_workflow(settings: Settings) -> dict[str, float]:
    """Bytes per workflow on the checkpoint topic (newest per key) and on the step log."""
    from stepledger.checkpoints.record import PROGRESS_KEY

    checkpoints, written, _ = _newest(settings, settings.checkpoint_topic)
    for where in [where for where in checkpoints if where[1] == PROGRESS_KEY]:
        del checkpoints[where]
    listed = [where for where in checkpoints if is_directory_key(where[1])]
    directory = sum(checkpoints.pop(where) for where in listed)
    steps, step_bytes, step_records = _newest(settings, settings.topic)
    workflows = len(steps)
    return {
        "checkpoint": sum(checkpoints.values()) / len(checkpoints),
        "directory": directory / len(checkpoints),
        "checkpoint_written": written,
        "checkpoints": len(checkpoints),
        "step_log": step_bytes / workflows,
        "step_records": step_records,
        "workflows": workflows,
    }


def handover(bootstrap: str, n: int, tmp: Path, kept_open: int) -> dict[str, float]:
    """A daemon replays ``n`` events from 0; a new one on an empty directory takes over."""
    settings = topic_settings(bootstrap)
    topic = settings.recovery_state_topic
    ensure_topics(settings, [topic], partitions=PARTITIONS, configs={topic: dict(COMPACTED)})
    tools = ToolRegistry([bench_tool(3600)])
    far = [datetime.now(UTC) + timedelta(hours=1)] * kept_open
    produce_bulk(
        settings, settled_history(n, "old") + open_intents(kept_open, far, bench_tool(3600))
    )
    first = Running(settings, tmp / "first", tools)
    join, replay = first.caught_up_after(timeout=900.0)
    replay_read = first.daemon.events_read
    first.stop(timeout=120.0)
    new = settled_history(max(min(3000, n // 10), n // 100), "new")
    produce_bulk(settings, new)
    second = Running(settings, tmp / "second", tools)  # no local state
    rejoin, handed = second.caught_up_after(timeout=900.0)
    tracked = second.daemon.tracker.open_count()
    read = second.daemon.events_read
    second.stop(timeout=120.0)
    assert tracked == kept_open, (
        f"{tracked} open intents tracked by the new owner, {kept_open} open"
    )
    return {
        "join": join,
        "replay": replay,
        "replay_read": replay_read,
        "rejoin": rejoin,
        "handover": handed,
        "read": read,
        "total": n // 3 * 3 + kept_open + len(new),
    }


@contextmanager
def _tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def run(
    quick: bool = False,
    bootstrap: str | None = None,
    sizes: tuple[int, ...] | None = None,
    recovery_events: int | None = None,
) -> list[Row]:
    """Resume from checkpoint plus tail at each size; recovery handover; sizes per workflow."""
    sizes = sizes or ((1_000, 4_000) if quick else (10_000, 100_000, 1_000_000))
    repeats, tail = (2, 100) if quick else (REPEATS, TAIL)
    n = recovery_events or (3_000 if quick else 1_000_000)
    kept_open = 100 if quick else 1000
    rows: list[Row] = []
    with broker(bootstrap) as servers, _tmp() as tmp:
        measured = []
        for size in sizes:
            settings, figures = resume_at(servers, size, repeats, tail)
            if size == sizes[0]:
                sized = sizes_per_workflow(settings)
            measured.append(figures)
        r = handover(servers, n, tmp, kept_open)
    ms = 1000.0
    first = measured[0]

    def took(what: str, seconds: float, against_ms: float | None, target: str = "") -> Row:
        """A time in ms, lower is better, against a target or a baseline of the same run."""
        return Row("checkpoint", what, seconds * ms, against_ms, "ms", target, False)

    for m in measured:
        label = f"{m.events:,} events + {tail:,} tail"
        fresh = f"open from checkpoint + tail, fresh Ledger, {label}"
        if m.from_checkpoint is not None:
            rows.append(took(f"{fresh} (vs the 100 ms target)", m.from_checkpoint, 100.0, "<=1"))
            whole = f"{fresh} (vs the whole partition, same log)"
            rows.append(took(whole, m.from_checkpoint, m.full_partition * ms))
        if m.warm is not None:
            warm = f"open from checkpoint + tail, warm Ledger, {label}"
            rows.append(took(warm, m.warm, 100.0, "<=1"))
        rows.append(
            Row(
                "checkpoint",
                f"open from the whole partition (no checkpoint read), fresh Ledger, {label}",
                m.full_partition * ms,
                None,
                "ms",
            )
        )
        rows.append(
            Row(
                "checkpoint",
                f"fresh checkpoint view: read the target's partition, {m.view_records:,} "
                f"checkpoints, {m.view_bytes / 1e6:.1f} MB, {label} (context)",
                m.view_s * ms,
                None,
                "ms",
            )
        )
        rows.append(
            Row(
                "checkpoint",
                f"checkpointer: step-log bytes held in memory after its catch-up (ended "
                f"workflows let go), {label} (context)",
                m.held_bytes,
                None,
                "bytes",
            )
        )
        rows.append(
            Row(
                "checkpoint",
                f"checkpointer catch-up, {label} (context)",
                m.events / m.checkpointer_s,
                None,
                "events/s",
            )
        )
    last = measured[-1]
    if last.from_checkpoint is not None and first.from_checkpoint is not None and last is not first:
        rows.append(
            Row(
                "checkpoint",
                f"open from checkpoint + tail on {last.events:,} vs {first.events:,} events",
                last.from_checkpoint * ms,
                first.from_checkpoint * ms,
                "ms",
                "<=1.5",
                False,
            )
        )
    total = int(r["total"])
    rows += [
        Row(
            "checkpoint",
            f"recovery: new owner, empty state dir, assigned to caught-up, {total:,} events "
            "(vs replay from offset 0)",
            r["handover"],
            r["replay"],
            "s",
            "<=0.2",
            False,
        ),
        Row(
            "checkpoint",
            "recovery: new owner, events read (vs the replay's)",
            r["read"],
            r["replay_read"],
            "events",
            "",
            False,
        ),
        Row("checkpoint", "recovery: new owner, group join (not above)", r["rejoin"], None, "s"),
        Row(
            "checkpoint",
            f"checkpoint topic bytes per workflow of {STEPS} steps, newest per key "
            "(vs step log bytes per workflow)",
            sized["checkpoint"],
            sized["step_log"],
            "bytes",
            "",
            False,
        ),
        Row(
            "checkpoint",
            "checkpoint directory bytes per workflow, newest per key (context)",
            sized["directory"],
            None,
            "bytes",
        ),
    ]
    return rows


def main() -> None:
    """``python -m bench.checkpoint``: the rows, with sizes of one's choosing."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--bootstrap", help="use this broker instead of a local one")
    parser.add_argument("--engine", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--sizes", help="comma-separated log sizes in events")
    parser.add_argument("--recovery-events", type=int, help="events in the handover's log")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    with run_broker(args.engine, args.bootstrap) as bootstrap:
        print(table(run(args.quick, bootstrap, sizes, args.recovery_events)))


if __name__ == "__main__":
    main()

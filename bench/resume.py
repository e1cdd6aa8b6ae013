"""Resume one workflow out of a large log: snapshot+tail lookup vs a raw full scan, same run.

- Resume: ``Ledger.workflow(id)`` through a ``SnapshotTailReader`` (the projector's
  published snapshot, then every partition's tail after the offsets it was taken at),
  appending the ``workflow_resumed`` event and replaying the workflow's four recorded
  steps without calling a tool.  The log holds 1M events (quick: 10k) and a tail of 10k
  events (quick: 500) written after the snapshot.  Target: under 1 s.
- Baseline: a raw full-topic scan for the workflow's key (a bare consumer, decoding only
  that workflow's records): what finding one workflow costs without an index.
- Growth: the same resume on a log ten times smaller; a ratio near 1 means the cost does
  not grow with the log.
- Context: the SDK's scan fallback (no snapshot) and the projector rebuild that made the
  snapshot.

``python -m bench.resume [--quick] [--bootstrap HOST:PORT]``
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.common import Row, broker, cli, fill_log, fresh_settings
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus, WorkflowStatus
from stepledger.domain.events import Event
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.history.protocol import Until
from stepledger.history.records import FIRST_OFFSET, read_to_end
from stepledger.kafka import Position, topic_partitions
from stepledger.kafka.consumer import FAST_CONSUMER
from stepledger.producer import Ledger, SnapshotTailReader, WorkflowReader
from stepledger.projector.rebuild import rebuild

TOOL = Tool(name="charge", effect="idempotent", keyed=True)
STEPS = 4
EVENTS_PER_WORKFLOW = 2 + 2 * STEPS
TARGET = "wf-target"
#: Timed runs per figure (medians): a tail read varies by tens of ms on the dev broker.
REPEATS = 15


@dataclass(frozen=True)
class Log:
    """One prepared log: its settings, its projection and how it was built."""

    settings: Settings
    db: Path
    events: int
    rebuild_s: float


def _events(factory: EventFactory, workflow_id: str, finished: bool) -> list[Any]:
    events = [
        factory.workflow_started(
            workflow_id, name="bench", attempt=1, read_only=False, max_attempts=10_000
        )
    ]
    for s in range(STEPS):
        args = {"amount": 100 + s, "customer": workflow_id, "memo": "x" * 60}
        events.append(factory.intent(workflow_id, f"s{s}", TOOL, args, sequence=s))
        status = OutcomeStatus.SUCCEEDED
        events.append(factory.outcome(workflow_id, f"s{s}", attempt=1, status=status, result=s))
    if finished:
        body_factory = factory.envelope
        from stepledger.domain import events as ev

        done = ev.WorkflowFinished(status=WorkflowStatus.COMPLETED)
        events.append(body_factory(workflow_id, None, done))
    return events


def finished_workflow(factory: EventFactory, workflow_id: str) -> list[Any]:
    """A finished workflow of ``STEPS`` steps (what the log is filled with)."""
    return _events(factory, workflow_id, finished=True)


def fill(settings: Settings, events: int, prefix: str, workers: int = 2) -> int:
    """Write about ``events`` events of finished workflows, in parallel worker processes."""
    return fill_log(settings, events, prefix, finished_workflow, EVENTS_PER_WORKFLOW, workers)


def prepare(bootstrap: str, events: int, tail: int, workdir: Path) -> Log:
    """A log of ``events`` events holding the target, its snapshot, then a tail after it."""
    settings = fresh_settings(bootstrap)
    written = fill(settings, events // 2, "a")
    with Ledger(settings) as ledger:
        # The target crashed before finishing: four recorded steps, no finish.
        for event in _events(ledger.events, TARGET, finished=False):
            ledger.log.append(event)
    written += fill(settings, events - written, "b")
    db = workdir / f"{settings.topic}.duckdb"
    began = time.perf_counter()
    rebuild(settings, db)
    rebuild_s = time.perf_counter() - began
    fill(settings, tail, "tail", workers=1)
    return Log(settings, db, written, rebuild_s)


def resume_once(ledger: Ledger) -> float:
    """Seconds for one resume: read, fold, append ``workflow_resumed``, replay the steps."""
    began = time.perf_counter()
    wf = ledger.workflow(TARGET)
    for s in range(STEPS):
        args = {"amount": 100 + s, "customer": TARGET, "memo": "x" * 60}
        assert wf.step(f"s{s}", TOOL, args, _never) == s
    return time.perf_counter() - began


class FullScan:
    """A workflow read by scanning every partition from its start (the context row: what
    an open cost before a workflow was read from its own partition)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.codec = Codec()

    def read(self, workflow_id: str) -> list[Event]:
        """Every partition from offset 0, to its end."""
        parts = topic_partitions(self.settings, self.settings.topic)
        starts = {(self.settings.topic, p): FIRST_OFFSET for p in parts}
        return read_to_end(self.settings, self.codec, starts, workflow_id)[0]

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """Not needed by an open."""
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to close."""


def cold_resume(settings: Settings, reader: WorkflowReader | None) -> float:
    """A resume in a fresh process: a new ledger whose producer starts with the resume."""
    with Ledger(settings, reader=reader) as ledger:
        return resume_once(ledger)


def warm_resumes(settings: Settings, db: Path, repeats: int) -> float:
    """Median resume in a process whose producer is connected (an agent resuming many)."""
    with Ledger(settings, reader=SnapshotTailReader(settings, db)) as ledger:
        ledger.workflow("warm-up")
        return median_of(lambda: resume_once(ledger), repeats)


def _never(args: dict[str, Any], key: str) -> Any:
    raise AssertionError("a recorded step must not call its tool")


def raw_scan(settings: Settings) -> float:
    """Seconds for a bare consumer to find the target's records in the whole topic."""
    key, codec = TARGET.encode(), Codec()
    began = time.perf_counter()
    partitions = topic_partitions(settings, settings.topic)
    consumer = Consumer(
        settings.client_config(
            **{**FAST_CONSUMER, "group.id": "bench-raw", "fetch.wait.max.ms": 10}
        )
    )
    consumer.assign([TopicPartition(settings.topic, p, 0) for p in partitions])
    found: list[object] = []
    at_end: set[int | None] = set()
    while len(at_end) < len(partitions):
        for msg in consumer.consume(10_000, 0.01):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            if msg.key() == key:
                found.append(codec.decode(msg.value() or b""))
    consumer.close()
    assert len(found) >= 1 + 2 * STEPS
    return time.perf_counter() - began


def median_of(fn: Callable[[], float], repeats: int) -> float:
    """The median of ``repeats`` timed runs."""
    return statistics.median(fn() for _ in range(repeats))


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Measure resume on a large and a ten-times smaller log."""
    large, tail = (10_000, 500) if quick else (1_000_000, 10_000)
    repeats = 3 if quick else REPEATS
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        small = prepare(servers, large // 10, tail, work)
        big = prepare(servers, large, tail, work)
        warm_small = warm_resumes(small.settings, small.db, repeats)
        warm_big = warm_resumes(big.settings, big.db, repeats)
        cold_big = median_of(
            lambda: cold_resume(big.settings, SnapshotTailReader(big.settings, big.db)),
            3 if quick else 7,
        )
        raw_big = median_of(lambda: raw_scan(big.settings), 1 if quick else 3)
        scan_big = cold_resume(big.settings, FullScan(big.settings))
    return rows(big, small, tail, warm_big, warm_small, cold_big, raw_big, scan_big)


def rows(
    big: Log,
    small: Log,
    tail: int,
    warm_big: float,
    warm_small: float,
    cold_big: float,
    raw_big: float,
    scan_big: float,
) -> list[Row]:
    """The result rows (milliseconds, ratios against the raw scan of the same log)."""
    ms, size = 1000.0, f"{big.events // 1000}k events + {tail // 1000}k tail"
    return [
        Row(
            "resume",
            f"resume, warm producer, {size} (vs raw full scan)",
            warm_big * ms,
            raw_big * ms,
            "ms",
            "<=0.25",
            False,
        ),
        Row(
            "resume",
            f"resume, fresh process, {size}; target < 1000 ms (vs raw full scan)",
            cold_big * ms,
            raw_big * ms,
            "ms",
            "<=0.5",
            False,
        ),
        Row(
            "resume",
            f"warm resume on {big.events // 1000}k vs {small.events // 1000}k events",
            warm_big * ms,
            warm_small * ms,
            "ms",
            "<=1.5",
            False,
        ),
        Row(
            "resume",
            f"resume via the scan fallback, {size} (vs raw full scan, context)",
            scan_big * ms,
            raw_big * ms,
            "ms",
            "",
            False,
        ),
        Row(
            "resume",
            "projector rebuild that made the snapshot (context)",
            big.events / big.rebuild_s,
            None,
            "events/s",
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

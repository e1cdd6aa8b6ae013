"""An analyst's queries on a lake of millions of events, filled by the projector without Kafka.

``python -m bench.lake --query-only --events 10000000 [--budget S]`` runs it
(:mod:`bench.lake`).  Through Kafka the lake fills at the lake projector's rate (about 7k
events/s on the 2-core machine: 10M events take ~24 minutes), but what an analyst's query
costs depends on the lake's tables, not on how the records reached the projector.  So the
records of :func:`bench.projector.workload` (made and encoded in a process of their own, as
a broker hands the daemon records it did not make) are routed to their partitions as the
producer routes them (:func:`~stepledger.kafka.partitioner.partition_of`) and handed, as
the library's own :class:`~stepledger.kafka.records.Consumed`, to the daemon's write path:
one :class:`~stepledger.projector.lake_shards.LakeShards`, one
:class:`~stepledger.projector.pipeline.Pipeline` and
:class:`~stepledger.projector.engine.Projector` per partition over its
:class:`~stepledger.projector.lake.LakeStore`, each committing in its own writer thread,
``BATCH_SIZE`` records a commit.

The fill leaves compaction out (the daemon's owners compact every minute between batches),
so the first queries see every batch's files; then :func:`bench.lake.analyst_rows` times the
point and the aggregate query through a read-only attach, compacts every table as the owners
do, and times them again (the rows every lake bench reports).  ``--budget``
stops the fill early (what was handed over is committed): the rows name the events the
lake holds.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.queues import Queue

from bench.common import Row, percentile
from bench.lake import analyst_rows
from bench.projector import workload_stream
from stepledger.codec import Codec
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.kafka.partitioner import partition_of
from stepledger.kafka.records import Consumed
from stepledger.projector.boundary import ViewStore
from stepledger.projector.daemon import fewer_collections
from stepledger.projector.engine import BatchReport, Projector
from stepledger.projector.lake import LakeDatabase
from stepledger.projector.lake_shards import LakeShards
from stepledger.projector.pipeline import Pipeline
from stepledger.readers.lake import LakeConfig

#: Records per commit of one partition (the daemon's default is 10k: larger batches fill
#: the lake faster and make fewer, larger files, the lake an owner's compaction tends to).
BATCH_SIZE = 100_000
#: Records per hand-over from the generating process, and hand-overs it may run ahead.
CHUNK = 20_000
QUEUED = 8
#: Longest wait for the generating process's next records (it died if they do not come).
GENERATE_TIMEOUT_S = 300.0
#: How often the fill says how far it got.
PROGRESS_EVERY = 500_000


@dataclass
class Fill:
    """How the lake was filled."""

    events: int = 0
    seconds: float = 0.0
    reports: list[BatchReport] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Events per second, from the partitions opened to the last batch committed."""
        return self.events / self.seconds if self.seconds else 0.0


def fill(
    lake: LakeConfig,
    log: str,
    n: int,
    partitions: int,
    *,
    batch_size: int = BATCH_SIZE,
    budget_s: float | None = None,
) -> Fill:
    """Project n workload events into the lake's tables of step log ``log``, no Kafka.

    Stops generating early once ``budget_s`` has passed (what was generated is committed).
    """
    done = Fill()
    # The owners' compaction is measured after the fill, not folded into it.
    db = LakeDatabase(lake, log, compact_every_s=float("inf"))

    def make(store: ViewStore) -> Pipeline:
        projector = Projector(store, Codec(), MemoryRecordLetters(), group="bench-lake")
        return Pipeline(projector, on_commit=done.reports.append, batch_size=batch_size)

    shards = LakeShards(db, make)
    try:
        with fewer_collections(), _generated(n) as records:
            wheres = [(log, p) for p in range(partitions)]
            shards.open(wheres)
            pipelines = [_pipeline(shards, w) for w in wheres]
            waiting: list[list[Consumed]] = [[] for _ in wheres]
            offsets = [0] * partitions
            began = time.perf_counter()
            for key, value in records:
                # Where the producer's partitioner puts the workflow's records.
                p = partition_of(key, partitions) or 0
                waiting[p].append(Consumed(log, p, offsets[p], key, value))
                offsets[p] += 1
                done.events += 1
                if len(waiting[p]) >= batch_size:
                    pipelines[p].feed(waiting[p])
                    waiting[p] = []
                if done.events % CHUNK == 0:
                    if done.events % PROGRESS_EVERY == 0:
                        _progress(done, began)
                    if budget_s is not None and time.perf_counter() - began > budget_s:
                        break
            for pipeline, batch in zip(pipelines, waiting, strict=True):
                pipeline.feed(batch)
            for pipeline in pipelines:
                pipeline.drain()
            done.seconds = time.perf_counter() - began
    finally:
        shards.shutdown()
    return done


@contextmanager
def _generated(n: int) -> Iterator[Iterator[tuple[bytes, bytes]]]:
    """The workload's records, made and encoded in a process of their own.

    Making and encoding an event costs about what projecting it does, and a broker hands
    the daemon records it did not make: so the projector's thread only projects here too.
    """
    context = multiprocessing.get_context("spawn")
    queue: Queue[list[tuple[bytes, bytes]] | None] = context.Queue(QUEUED)
    process = context.Process(target=_generate, args=(n, queue), daemon=True)
    process.start()

    def records() -> Iterator[tuple[bytes, bytes]]:
        while (chunk := queue.get(timeout=GENERATE_TIMEOUT_S)) is not None:
            yield from chunk

    try:
        yield records()
    finally:
        if process.is_alive():
            process.terminate()  # stopped early (a budget): its records are not wanted
        process.join(10)


def _generate(n: int, queue: Queue[list[tuple[bytes, bytes]] | None]) -> None:
    chunk: list[tuple[bytes, bytes]] = []
    for record in workload_stream(n):
        chunk.append(record)
        if len(chunk) == CHUNK:
            queue.put(chunk)
            chunk = []
    queue.put(chunk)
    queue.put(None)


def _pipeline(shards: LakeShards, where: tuple[str, int]) -> Pipeline:
    pipeline = shards.pipeline(where)
    if pipeline is None:
        raise RuntimeError(f"{where} was opened but has no pipeline")
    return pipeline


def _progress(done: Fill, began: float) -> None:
    took = time.perf_counter() - began
    committed = sum(r.received for r in done.reports)
    print(
        f"[lake] {done.events:,} events generated, {committed:,} committed in {took:.0f}s "
        f"({committed / took:,.0f} events/s)",
        flush=True,
    )


def measure(
    n: int, partitions: int, lake: LakeConfig, *, budget_s: float | None = None
) -> list[Row]:
    """Fill a fresh lake with n events (or what ``budget_s`` allows), then time the queries."""
    log = f"bench-{uuid.uuid4().hex[:8]}"
    filled = fill(lake, log, n, partitions, budget_s=budget_s)
    analyst = analyst_rows(lake, log)
    commits = [r.seconds for r in filled.reports]
    size = f"{filled.events:,} events, {partitions} partitions, no Kafka"
    return [
        Row(
            "lake",
            f"events/s into the lake, in-process projector ({size})",
            filled.rate,
            None,
            "events/s",
        ),
        Row(
            "lake",
            f"batch (up to {BATCH_SIZE:,} records) prepared to committed, p50",
            percentile(commits, 50),
            None,
            "s",
            "",
            False,
        ),
        Row(
            "lake",
            f"batch (up to {BATCH_SIZE:,} records) prepared to committed, p95",
            percentile(commits, 95),
            None,
            "s",
            "",
            False,
        ),
        *analyst,
    ]

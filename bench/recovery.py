"""Recovery daemon: restart cost with a checkpoint, resolution latency, memory per open intent.

- Restart: a log of 1M settled events (5k quick) plus 1,000 open intents (100).  The first
  daemon replays it all (no checkpoint: the baseline); after a graceful stop and 10k new
  events, a restarted daemon resumes from its checkpoint.  Both times run from process
  start of the daemon to every partition caught up (group join included).  Target <= 0.2.
- Latency: 10k open intents (200 quick) coming due over a few seconds, resolved by a query
  hook that answers at once; latency is the decision's time minus the intent's deadline
  (grace 0).  Baseline: one raw resolution done inline (query + durable append).
- Memory: bytes the daemon's tracker retains per open intent (decoded event, its fold,
  the due heap), against the intent's encoded size on the wire.

Run: ``python -m bench.recovery [--quick]`` (or ``python -m bench --only recovery``).
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    Row,
    broker,
    cli,
    fixed_clock,
    fresh_settings,
    percentile,
    produce_bulk,
)
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import resolution as rs
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepState
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.log import KafkaEventLog
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.recovery.tracker import Tracker
from stepledger.resolution.registry import ToolRegistry

ARGS = {"amount": 1250, "currency": "EUR", "customer": "cus_0001", "memo": "x" * 120}
#: Intents falling due per second in the latency measurement.
RATE = 100
FAST_FETCH = {"fetch.wait.max.ms": 10}


def _found(args: dict[str, Any], key: str) -> Found | NotFound:
    return Found({"charge": key})


def bench_tool(timeout_s: float) -> Tool:
    """A keyed, queryable tool whose query answers at once (the daemon's own cost shows)."""
    return Tool(
        name="bench.pay",
        effect="idempotent",
        keyed=True,
        policy="query",
        query=_found,
        timeout_s=timeout_s,
    )


def settled_history(n: int, prefix: str) -> list[tuple[bytes, bytes]]:
    """``n`` events: workflows whose one step an agent intended and finished."""
    codec, factory, tool = Codec(), EventFactory("bench", "agent"), bench_tool(30)
    records = []
    for i in range(n // 3):
        wf = f"{prefix}-{i}"
        for event in (
            factory.workflow_started(wf, name="", attempt=1, read_only=False, max_attempts=3),
            factory.intent(wf, "s", tool, ARGS, sequence=0),
            factory.outcome(wf, "s", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"i": i}),
        ):
            records.append((wf.encode(), codec.encode(event)))
    return records


def open_intents(
    n: int, due: list[datetime], tool: Tool, prefix: str = "open"
) -> list[tuple[bytes, bytes]]:
    """``n`` intents without outcomes whose deadlines are ``due[i]``.

    Each is recorded now (or ``tool``'s timeout before its deadline, if that is earlier)
    with the timeout that ends at its deadline: the daemon measures a deadline from the
    intent's arrival, so the timeout is what places it.
    """
    codec, now = Codec(), datetime.now(UTC)
    records = []
    for i in range(n):
        start = min(now, due[i] - timedelta(seconds=tool.timeout_s))
        timed = tool.model_copy(update={"timeout_s": (due[i] - start).total_seconds()})
        factory = EventFactory("bench", "agent", clock=fixed_clock(start))
        event = factory.intent(f"{prefix}-{i}", "s", timed, {**ARGS, "i": i}, sequence=0)
        records.append((event.workflow_id.encode(), codec.encode(event)))
    return records


class Running:
    """A daemon on a thread, for measuring."""

    def __init__(
        self,
        settings: Settings,
        state: Path,
        tools: ToolRegistry,
        workers: int = 8,
        grace_s: float = 0.0,
    ):
        options = DaemonOptions(
            state_dir=state,
            grace_s=grace_s,
            workers=workers,
            session_timeout_s=2.0,
            consumer=FAST_FETCH,
            health_interval_s=60.0,
        )
        self.daemon = RecoveryDaemon(settings, tools, options, dead_letters=MemoryEventLetters())
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self.daemon.run, daemon=True)
        self.thread.start()

    def caught_up_after(self, timeout: float = 600.0) -> tuple[float, float]:
        """(s from start to partitions assigned, s from assignment to all caught up)."""
        deadline = time.monotonic() + timeout
        assigned_at: float | None = None
        while time.monotonic() < deadline:
            d = self.daemon
            if assigned_at is None and d.assigned:
                assigned_at = time.perf_counter()
            if assigned_at is not None and d.assigned <= d.caught_up:
                return assigned_at - self.started, time.perf_counter() - assigned_at
            time.sleep(0.002)
        raise TimeoutError("the daemon did not catch up")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop gracefully (checkpoint written)."""
        self.daemon.shutdown.request()
        self.thread.join(timeout=timeout)


def restart_cost(servers: str, n: int, tmp: Path, kept_open: int = 1000) -> dict[str, float]:
    """Full replay vs restart from a checkpoint, after ``n`` events and ``kept_open`` intents."""
    settings = fresh_settings(servers)
    tools = ToolRegistry([bench_tool(3600)])
    far = [datetime.now(UTC) + timedelta(hours=1)] * kept_open
    history = settled_history(n, "old")
    produce_bulk(settings, history + open_intents(kept_open, far, bench_tool(3600)))
    first = Running(settings, tmp / "restart", tools)
    join, full = first.caught_up_after()
    first.stop()
    new = settled_history(max(min(3000, n // 10), n // 100), "new")
    produce_bulk(settings, new)
    second = Running(settings, tmp / "restart", tools)
    rejoin, restart = second.caught_up_after()
    read = second.daemon.events_read
    # Caught up means the tail is folded in (the daemon publishes a partition's end after
    # the records read before it), so the count is the restarted daemon's whole state.
    tracked = second.daemon.tracker.open_count()
    assert tracked == kept_open, (
        f"{tracked} open intents tracked after the restart, {kept_open} open"
    )
    second.stop()
    total = n // 3 * 3 + kept_open + len(new)
    return {
        "join": join,
        "full": full,
        "rejoin": rejoin,
        "restart": restart,
        "read": read,
        "total": total,
    }


def resolution_latency(
    servers: str, opened: int, due_n: int, rate: float | None, tmp: Path
) -> list[float]:
    """Seconds from deadline to decision for ``due_n`` of ``opened`` open intents.

    The other intents stay open (their deadlines are an hour away) so the daemon holds
    ``opened`` open intents throughout; the measured ones fall due at ``rate`` per second,
    or all at the same instant when ``rate`` is None (a burst: it measures capacity).
    """
    settings = fresh_settings(servers)
    tool = bench_tool(1.0)
    daemon = Running(settings, tmp / f"latency-{rate}", ToolRegistry([tool]))
    daemon.caught_up_after()
    # One resolution first, so the daemon's producer is connected before the clock runs.
    produce_bulk(settings, open_intents(1, [datetime.now(UTC)], tool, prefix="warm"))
    _wait_resolved(daemon.daemon.tracker, 1, time.monotonic() + 30)
    far = [datetime.now(UTC) + timedelta(hours=1)] * (opened - due_n)
    lead = 2.0 + opened / 10_000  # time to write the intents before the first falls due
    base = datetime.now(UTC) + timedelta(seconds=lead)
    due = [base + timedelta(seconds=0 if rate is None else i / rate) for i in range(due_n)]
    produce_bulk(
        settings,
        open_intents(opened - due_n, far, tool, prefix="far") + open_intents(due_n, due, tool),
    )
    limit = time.monotonic() + lead + due_n / 50 + 60
    _wait_resolved(daemon.daemon.tracker, opened + 1, limit, still_open=opened - due_n)
    steps = tracked_steps(daemon.daemon.tracker)
    daemon.stop()
    return [
        (s.resolved_at - deadline).total_seconds()
        for (workflow, _), s, deadline in steps
        if s.resolved_at is not None and deadline is not None and workflow.startswith("open-")
    ]


def _wait_resolved(tracker: Tracker, n: int, deadline: float, still_open: int = 0) -> None:
    # Latency is read from the decisions' own times, not from this check: checking every
    # 0.5 s (a pass over every tracked step) keeps the harness from competing with the
    # daemon for the interpreter (at every 20 ms it took ~30% of the GIL in a burst, at
    # every 0.1 s ~5%: 10,000 steps, py-spy --gil, 2026-12-02).
    while not _all_resolved(tracker, n, still_open):
        if time.monotonic() > deadline:
            raise TimeoutError("intents were not all resolved")
        time.sleep(0.5)


def tracked_steps(
    tracker: Tracker,
) -> list[tuple[tuple[str, str], StepState, datetime | None]]:
    """The tracker's steps and their deadlines on the daemon's clock (from each intent's
    arrival), read from another thread while the daemon runs."""
    for _ in range(100):
        try:
            return [(key, t.step, t.deadline) for key, t in tracker]
        except RuntimeError:
            time.sleep(0.01)
    raise RuntimeError("could not read the tracker")


def _all_resolved(tracker: Tracker, n: int, still_open: int) -> bool:
    # Read from another thread while the daemon runs: a changing dict may refuse iteration.
    try:
        return len(tracker.steps) >= n and tracker.open_count() == still_open
    except RuntimeError:
        return False


def raw_resolution(servers: str, n: int = 300) -> list[float]:
    """Seconds for one inline resolution: query the tool, append the outcome durably."""
    settings = fresh_settings(servers)
    factory, log, tool = EventFactory("bench", "raw"), KafkaEventLog(settings), bench_tool(1.0)
    times = []
    try:
        log.append(
            factory.workflow_started("raw", name="", attempt=1, read_only=False, max_attempts=1)
        )  # connect first
        for i in range(n):
            began = time.perf_counter()
            answer = _found(ARGS, f"k{i}")
            log.append(
                factory.outcome(
                    f"raw-{i}",
                    "s",
                    attempt=1,
                    status=rs.query_status(answer),
                    result=answer.result if isinstance(answer, Found) else None,
                )
            )
            times.append(time.perf_counter() - began)
    finally:
        log.close()
    del tool
    return times


def memory_per_intent(n: int) -> tuple[float, float, float]:
    """Bytes the daemon's tracker retains per open intent once a checkpoint took its
    changes, the same before it (nothing is made ahead of the checkpoint: its lines are
    written from the values then), and the encoded bytes per intent."""
    tool = bench_tool(3600)
    records = open_intents(n, [datetime.now(UTC) + timedelta(hours=1)] * n, tool)
    codec = Codec()
    wire = sum(len(v) for _, v in records) / n
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    tracker = Tracker(lambda s, a: rs.due_at(s, tool, grace=timedelta(0), arrival=a))
    for offset, (_, value) in enumerate(records):
        tracker.apply(codec.decode(value), 0, offset)
    gc.collect()
    pending = tracemalloc.take_snapshot()
    batch = tracker.take_batch(datetime.now(UTC))
    del batch  # written by the checkpoint, then dropped
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    retained = sum(s.size_diff for s in after.compare_to(before, "filename"))
    peak = sum(s.size_diff for s in pending.compare_to(before, "filename"))
    assert tracker.open_count() == n
    return retained / n, peak / n, wire


def checkpoint_lines(n: int, rounds: int = 5) -> dict[str, float]:
    """Microseconds: a new intent's ``Tracker.apply`` (with the value as read) and its share
    of the checkpoint that takes ``n`` of them (the round with the least of both)."""
    tool = bench_tool(3600)
    records = open_intents(n, [datetime.now(UTC) + timedelta(hours=1)] * n, tool)
    codec = Codec()
    values = [value for _, value in records]
    events = [codec.decode(value) for value in values]
    spent: list[tuple[float, float]] = []
    for _ in range(rounds):
        tracker = Tracker(lambda s, a: rs.due_at(s, tool, grace=timedelta(0), arrival=a))
        gc.collect()
        began = time.perf_counter()
        for offset, (event, value) in enumerate(zip(events, values, strict=True)):
            tracker.apply(event, 0, offset, value)
        applied = time.perf_counter()
        tracker.take_batch(datetime.now(UTC))
        spent.append((applied - began, time.perf_counter() - applied))
    apply_s, batch_s = min(spent, key=sum)
    return {
        "apply": apply_s / n * 1e6,
        "batch": batch_s / n * 1e6,
    }


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Restart on 1M events (5k quick); latency with 10k open intents (200 quick); memory."""
    history, opened = (5_000, 200) if quick else (1_000_000, 10_000)
    paced_n, burst_n = (50, 100) if quick else (1_000, 3_000)
    kept_open = 100 if quick else 1000
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        r = restart_cost(servers, history, tmp, kept_open)
        paced = resolution_latency(servers, opened, paced_n, RATE, tmp)
        burst = resolution_latency(servers, opened, burst_n, None, tmp)
        raw = raw_resolution(servers)
    per_intent, pending, wire = memory_per_intent(opened)
    lines = checkpoint_lines(opened)
    ms, total = 1000.0, int(r["total"])
    capacity = burst_n / max(burst)
    return [
        Row(
            "recovery",
            f"restart: assigned to caught-up, {total:,} events (vs full replay)",
            r["restart"],
            r["full"],
            "s",
            "<=0.2",
            False,
        ),
        Row(
            "recovery",
            "restart: events read (vs events in the log)",
            r["read"],
            total,
            "events",
            "<=0.05",
            False,
        ),
        Row(
            "recovery",
            "restart: group join (not in the row above)",
            r["rejoin"],
            None,
            "s",
            "",
            False,
        ),
        Row(
            "recovery",
            f"latency after deadline p50: {opened:,} open, {paced_n:,} due at {RATE:,}/s "
            "(vs one inline query+append)",
            percentile(paced, 50) * ms,
            percentile(raw, 50) * ms,
            "ms",
            "",
            False,
        ),
        Row(
            "recovery",
            f"latency after deadline p99: {opened:,} open, {paced_n:,} due at {RATE:,}/s",
            percentile(paced, 99) * ms,
            percentile(raw, 99) * ms,
            "ms",
            "",
            False,
        ),
        Row(
            "recovery",
            f"capacity: {burst_n:,} of {opened:,} open intents due at once (vs inline, 1 thread)",
            capacity,
            1 / statistics.mean(raw),
            "resolutions/s",
            "",
            True,
        ),
        Row(
            "recovery",
            f"burst of {burst_n:,}: latency after deadline p99",
            percentile(burst, 99) * ms,
            None,
            "ms",
            "",
            False,
        ),
        Row(
            "recovery",
            "memory per open intent (vs its encoded size)",
            per_intent,
            wire,
            "bytes",
            "<=3",
            False,
        ),
        Row(
            "recovery",
            "memory per open intent before a checkpoint (vs encoded size)",
            pending,
            wire,
            "bytes",
            "<=3",
            False,
        ),
        Row(
            "recovery",
            f"a new intent: apply + its share of a checkpoint of {opened:,}",
            lines["apply"] + lines["batch"],
            None,
            "us",
            "",
            False,
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

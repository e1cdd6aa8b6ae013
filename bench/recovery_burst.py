"""Recovery capacity under a burst, alone, in rounds: where the daemon's CPU goes.

Each round: a daemon tracking 10,000 open intents (1,000 quick) of which 3,000 (300) fall
due at one instant, resolved by a query hook that answers at once (``bench.recovery``'s
tool and intents); then the inline baseline (query + durable append, one thread).  Per
round: capacity (due / the last decision's time after the deadline), the process's CPU
per resolution from the due instant to the last decision (Python threads and librdkafka's
threads apart, from ``/proc/self/task``).

Beside them, the same resolutions' own work on one thread with no broker: the tracker
folds the due intents, the resolver decides each (the hook called in place, events sent to
an in-memory log), the tracker folds the decisions back and a checkpoint batch takes them.
What the daemon spends beyond that goes to threads handing work over, librdkafka's
clients and the interpreter's lock.

Rounds alternate two ways of calling the hook: through the hook pool, as the daemon does,
and on the worker itself with no time bound.  The second is a diagnostic, not a mode the
daemon has: a hook that hangs must not hold a worker, so the daemon hands every call to a
pool thread and waits for it with the tool's timeout.  The difference between the two is
what that hand-off costs a resolution.

Run: ``python -m bench.recovery_burst [--quick] [--engine kafka]``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import Row, broker, cli, fresh_settings, produce_bulk, thread_ticks
from bench.recovery import Running, bench_tool, open_intents, raw_resolution, tracked_steps
from stepledger.codec import Codec
from stepledger.domain import resolution as rs
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepState, replay
from stepledger.log import InMemoryEventLog
from stepledger.recovery.tracker import Tracker
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver

#: The resolutions metric's sample for the bench tool's answers.
_RESOLVED = ("stepledger_recovery_resolutions_total", {"policy": "query", "result": "succeeded"})


class _OnTheWorker:
    """Calls a hook on the caller's thread, unbounded (the diagnostic mode above)."""

    def call(
        self, hook: Callable[..., Any], args: tuple[Any, ...], timeout: float, name: str
    ) -> Any:
        return hook(*args)


def own_work(n: int) -> float:
    """CPU seconds per resolution of the daemon's own work on one thread, no broker."""
    tool, codec = bench_tool(1.0), Codec()
    tools = ToolRegistry([tool])

    def due(step: StepState, arrival: rs.Arrival | None) -> datetime | None:
        tool = tools.get(step.tool)
        return rs.due_at(step, tool, grace=timedelta(0), retry_base_s=0.25, arrival=arrival)

    tracker = Tracker(due)
    resolver = Resolver(
        InMemoryEventLog(),
        EventFactory("bench", "recovery"),
        tools,
        hooks=_OnTheWorker(),  # type: ignore[arg-type]
        pipeline=True,
    )
    past = datetime.now(UTC) - timedelta(seconds=5)
    for offset, (_, value) in enumerate(open_intents(n, [past] * n, tool)):
        tracker.apply(codec.decode(value), 0, offset, value)
    tracker.take_batch(datetime.now(UTC))
    offset, began = n, time.process_time()
    for key in tracker.due(datetime.now(UTC), n, {0}):
        resolution = resolver.begin(replay(key[0], list(tracker.events_of(key))), key[1])()
        for event in resolution.events:
            tracker.apply(event, 0, offset, codec.encode(event))
            offset += 1
        tracker.release(key, echo_offset=offset - 1, not_before=None)
    tracker.take_batch(datetime.now(UTC))
    return (time.process_time() - began) / n


def burst(
    servers: str, opened: int, due_n: int, state: Path, *, on_worker: bool
) -> tuple[float, float, float]:
    """(capacity per s, Python CPU s per resolution, librdkafka CPU s per resolution)."""
    settings = fresh_settings(servers)
    tool = bench_tool(1.0)
    daemon = Running(settings, state, ToolRegistry([tool]))
    if on_worker:
        daemon.daemon.resolver.hooks = _OnTheWorker()  # type: ignore[assignment]
    daemon.caught_up_after()
    registry = daemon.daemon.metrics.registry

    def resolved() -> float:
        return registry.get_sample_value(*_RESOLVED) or 0.0

    produce_bulk(settings, open_intents(1, [datetime.now(UTC)], tool, prefix="warm"))
    _until(lambda: resolved() >= 1, 30)
    far = [datetime.now(UTC) + timedelta(hours=1)] * (opened - due_n)
    lead = 2.0 + opened / 5_000  # time to write and read the intents before they fall due
    due = datetime.now(UTC) + timedelta(seconds=lead)
    produce_bulk(
        settings,
        open_intents(opened - due_n, far, tool, prefix="far")
        + open_intents(due_n, [due] * due_n, tool),
    )
    _until(lambda: daemon.daemon.events_read >= opened + 1, lead + 60)
    time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
    before, cpu = thread_ticks(), time.process_time()
    _until(lambda: resolved() >= due_n + 1, due_n / 20 + 60)
    cpu, after = time.process_time() - cpu, thread_ticks()
    kafka = sum(t - before.get(k, 0) for k, t in after.items() if k[1].startswith("rdk:"))
    tick = os.sysconf("SC_CLK_TCK")
    steps = [
        (s, deadline)
        for (wf, _), s, deadline in tracked_steps(daemon.daemon.tracker)
        if wf.startswith("open-") and s.resolved_at is not None and deadline is not None
    ]
    daemon.stop()
    # The deadlines are on the daemon's clock, from each intent's arrival: the burst begins
    # at the first of them.
    first = min(deadline for _, deadline in steps)
    last = max((s.resolved_at - first).total_seconds() for s, _ in steps if s.resolved_at)
    librdkafka = kafka / tick
    return due_n / last, (cpu - librdkafka) / due_n, librdkafka / due_n


def _until(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the burst was not resolved in time")
        time.sleep(0.02)


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Rounds of the burst, the hook called both ways, each beside the inline baseline."""
    opened, due_n, rounds = (1_000, 300, 1) if quick else (10_000, 3_000, 3)
    #: Per way of calling the hook, each round's (capacity, inline, Python CPU, librdkafka CPU).
    found: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for on_worker in (False, True):
                state = Path(tmp) / f"{i}-{on_worker}"
                capacity, python, kafka = burst(servers, opened, due_n, state, on_worker=on_worker)
                inline = 1 / statistics.mean(raw_resolution(servers, 100 if quick else 300))
                found[on_worker].append((capacity, inline, python, kafka))
    rows = [
        Row(
            "recovery_burst",
            f"the same work on one thread, no broker ({due_n:,} resolutions, in-memory log): "
            "CPU per resolution",
            own_work(due_n) * 1e6,
            None,
            "us",
            "",
            False,
        )
    ]
    for on_worker, label in (
        (False, "hooks on the pool (the daemon)"),
        (True, "hooks on the worker"),
    ):
        ratios = [capacity / inline for capacity, inline, _, _ in found[on_worker]]
        rows += [
            Row(
                "recovery_burst",
                f"{label}: capacity, {due_n:,} of {opened:,} due at once, median of {rounds} "
                f"(vs inline, 1 thread; ratio each round: {', '.join(f'{r:.2f}' for r in ratios)})",
                statistics.median(r[0] for r in found[on_worker]),
                statistics.median(r[1] for r in found[on_worker]),
                "resolutions/s",
                "" if on_worker else ">=0.5",
                True,
            ),
            Row(
                "recovery_burst",
                f"{label}: CPU per resolution, Python threads (librdkafka's threads: "
                f"{statistics.median(r[3] for r in found[on_worker]) * 1e6:,.0f} us more)",
                statistics.median(r[2] for r in found[on_worker]) * 1e6,
                None,
                "us",
                "",
                False,
            ),
        ]
    return rows


if __name__ == "__main__":
    cli(run, __doc__)

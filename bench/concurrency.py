"""Many agents in one process, stepledger beside the raw two-acks floor, same broker, same run.

For 1, 8, 32 and 64 agents (quick: 8), as threads and as asyncio coroutines, medians of
three runs (quick: one), stepledger and the floor interleaved:

- the **raw floor**: confluent-kafka with the SDK's producer settings (``acks=all``,
  idempotent, linger 0), each agent producing two records per step (the bytes of an intent
  and of an outcome) and waiting for each one's delivery report before the next, reports
  served by one poller thread;
- **stepledger**: the same agents through one ``Ledger``: ``ledger.start(id)`` (asyncio:
  ``await ledger.astart(id)``), ``STEPS`` steps of a trivial tool, ``finish``;
- **stepledger, pipelined outcomes**: the same with ``ResumeOptions(pipeline_outcomes=True)``
  (a step's outcome is acknowledged with the next event: docs/guarantees.md).

Figures: steps/s (target: at least 0.5 of the floor), the process's CPU per step
(``time.process_time``, the broker runs in another process; target: at most 2x the raw
client's), and the broker's CPU per step (no target: what small produce requests cost;
only for a broker process on this machine, found by its listening port).  Then, at 32
agents (quick: 8 threads): opening a workflow with ``ledger.workflow(id)`` against
``start``, for a new id and for an id started earlier (the open reads the log and appends
``workflow_resumed``); target: at most 10% of throughput lost.

``python -m bench.concurrency [--quick] [--engine kafka]``
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

import stepledger as sl
from bench.common import Row, broker, broker_pids, cli, cpu_seconds, fresh_settings
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.kafka import DURABLE_PRODUCER
from stepledger.log import event_headers
from stepledger.producer.session import ResumeOptions

#: Steps per workflow (each workflow also writes a started and a finished event).
STEPS = 10
MODES = ("threads", "asyncio")
OPENS = ("open new", "open existing")
#: Runs per figure (medians): the machine is shared, one run swings by 2x.
REPEATS = 3
#: The label of rows measured with ``ResumeOptions(pipeline_outcomes=True)``.
PIPELINED = ", pipelined outcomes"


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """The bench's tool: the work measured is the ledger's own."""
    return i


@sl.tool(keyed=True, name="act")
async def aact(i: int, *, idempotency_key: str) -> int:
    """The same tool for asyncio agents."""
    return i


@dataclass(frozen=True)
class Figure:
    """One measurement: steps per second, the process's and the broker's CPU per step."""

    steps_per_s: float
    cpu_us: float
    broker_us: float = 0.0


#: The broker's processes when it runs on this machine (set by ``run``; empty: not measured).
BROKERS: list[int] = []


def _measured(steps: int, body: Callable[[], None]) -> Figure:
    served = cpu_seconds(BROKERS)
    cpu, wall = time.process_time(), time.perf_counter()
    body()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    served = cpu_seconds(BROKERS) - served
    return Figure(steps / wall, cpu / steps * 1e6, served / steps * 1e6)


def _in_threads(agents: int, agent: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=agent, args=(a,), daemon=True) for a in range(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
        assert not thread.is_alive(), "an agent did not finish in 600 s"


def _in_asyncio(agents: int, agent: Callable[[int], Awaitable[None]]) -> None:
    async def all_agents() -> None:
        await asyncio.gather(*(agent(a) for a in range(agents)))

    asyncio.run(all_agents())


# -- the raw floor ---------------------------------------------------------------------------


def _step_records(settings: Settings) -> list[tuple[bytes, bytes, list[Any]]]:
    """The bytes of one step's intent and outcome, as the SDK encodes them."""
    codec, factory = Codec(), EventFactory("bench", "bench")
    intent = factory.intent("wf-raw", "s0", act, {"i": 0}, sequence=0)
    outcome = factory.outcome(
        "wf-raw", "s0", attempt=1, status=OutcomeStatus.SUCCEEDED, result="0", result_type=None
    )
    return [
        (e.workflow_id.encode(), codec.encode(e), list(event_headers(e))) for e in (intent, outcome)
    ]


def _setter(done: threading.Event) -> Callable[[KafkaError | None, Message], None]:
    return lambda err, msg: done.set()


class RawFloor:
    """confluent-kafka with the SDK's producer settings; one thread serves every report."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.records = _step_records(settings)
        conf = settings.client_config(**DURABLE_PRODUCER, **{"enable.sparse.connections": False})
        self.producer = Producer(conf)
        self.producer.produce(settings.topic, b"warm-up", b"warm-up")
        self.producer.flush(10)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def _produce(
        self, n: int, i: int, on_delivery: Callable[[KafkaError | None, Message], None]
    ) -> None:
        key, value, headers = self.records[i]
        topic = self.settings.topic
        self.producer.produce(
            topic, value, key + str(n).encode(), headers=headers, on_delivery=on_delivery
        )

    def threads(self, agents: int, steps: int) -> Figure:
        """Every agent a thread waiting on an Event per record."""

        def agent(a: int) -> None:
            for _ in range(steps):
                for i in (0, 1):
                    done = threading.Event()
                    self._produce(a, i, _setter(done))
                    done.wait(30)

        return _measured(agents * steps, lambda: _in_threads(agents, agent))

    def asyncio(self, agents: int, steps: int) -> Figure:
        """Every agent a coroutine awaiting a future the poller thread resolves."""

        async def agent(a: int) -> None:
            loop = asyncio.get_running_loop()
            for _ in range(steps):
                for i in (0, 1):
                    future: asyncio.Future[None] = loop.create_future()

                    def settle(err: KafkaError | None, msg: Message, f: Any = future) -> None:
                        loop.call_soon_threadsafe(f.set_result, None)

                    self._produce(a, i, settle)
                    await asyncio.wait_for(future, 30)

        return _measured(agents * steps, lambda: _in_asyncio(agents, agent))

    def close(self) -> None:
        """Stop the poller and flush."""
        self._stop.set()
        self._poller.join(5)
        self.producer.flush(10)


# -- stepledger ------------------------------------------------------------------------------


def warm_ledger(settings: Settings, pipelined: bool = False) -> sl.Ledger:
    """A Ledger whose producer id and connection are made by one finished warm-up step."""
    options = ResumeOptions(pipeline_outcomes=pipelined)
    ledger = sl.Ledger(settings, tools=[act], options=options)
    wf = ledger.start(f"warm-up-{uuid.uuid4().hex[:6]}")  # the producer id, the connection
    wf.step("s0", act, i=0)
    wf.finish()
    return ledger


def stepledger_threads(ledger: sl.Ledger, agents: int, steps: int, how: str) -> Figure:
    """Agents in threads: ``start`` (or ``workflow``) then STEPS steps, then ``finish``."""
    run = uuid.uuid4().hex[:6]
    ids = [[f"{run}-{a}-{w}" for w in range(steps // STEPS)] for a in range(agents)]
    if how == "open existing":
        for row in ids:
            for wid in row:
                ledger.start(wid)
    opener = ledger.start if how == "start" else ledger.workflow

    def agent(a: int) -> None:
        for wid in ids[a]:
            wf = opener(wid)
            for i in range(STEPS):
                wf.step(f"s{i}", act, i=i)
            wf.finish()

    return _measured(agents * steps, lambda: _in_threads(agents, agent))


def stepledger_asyncio(
    ledger: sl.Ledger, agents: int, steps: int, how: str, tool: sl.Tool = aact
) -> Figure:
    """Agents as coroutines: ``astart`` (or ``aworkflow``), STEPS ``astep`` of ``tool``,
    ``afinish``."""
    run = uuid.uuid4().hex[:6]
    ids = [[f"{run}-{a}-{w}" for w in range(steps // STEPS)] for a in range(agents)]
    if how == "open existing":
        for row in ids:
            for wid in row:
                ledger.start(wid)

    async def agent(a: int) -> None:
        for wid in ids[a]:
            wf = await (ledger.astart(wid) if how == "start" else ledger.aworkflow(wid))
            for i in range(STEPS):
                await wf.astep(f"s{i}", tool, i=i)
            await wf.afinish()

    return _measured(agents * steps, lambda: _in_asyncio(agents, agent))


def stepledger_figure(
    settings: Settings, mode: str, agents: int, steps: int, how: str, pipelined: bool = False
) -> Figure:
    """One stepledger measurement on a fresh, warmed-up ledger."""
    with warm_ledger(settings, pipelined) as ledger:
        run = stepledger_threads if mode == "threads" else stepledger_asyncio
        return run(ledger, agents, steps, how)


# -- the run ---------------------------------------------------------------------------------


def _median(figures: list[Figure]) -> Figure:
    return Figure(
        statistics.median(f.steps_per_s for f in figures),
        statistics.median(f.cpu_us for f in figures),
        statistics.median(f.broker_us for f in figures),
    )


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Every agent count in both modes, then open against start (medians, interleaved)."""
    counts, per_agent, repeats = ((8,), 10, 1) if quick else ((1, 8, 32, 64), 200, REPEATS)
    open_at = 8 if quick else 32
    rows: list[Row] = []
    with broker(bootstrap) as servers:
        BROKERS[:] = broker_pids(servers)
        raw = RawFloor(fresh_settings(servers))
        try:
            for agents in counts:
                steps = per_agent if agents > 1 else per_agent * 4
                for mode in MODES:
                    floors, ours, piped = [], [], []
                    for _ in range(repeats):  # interleaved: all see the same moments of load
                        floors.append(getattr(raw, mode)(agents, steps))
                        settings = fresh_settings(servers)
                        ours.append(stepledger_figure(settings, mode, agents, steps, "start"))
                        settings = fresh_settings(servers)
                        piped.append(
                            stepledger_figure(settings, mode, agents, steps, "start", True)
                        )
                    rows += _rows(agents, mode, _median(ours), _median(floors))
                    rows += _rows(agents, mode, _median(piped), _median(floors), PIPELINED)
            for mode in MODES[:1] if quick else MODES:
                rows += _open_rows(servers, mode, open_at, per_agent, repeats)
        finally:
            raw.close()
    return rows


def _open_rows(servers: str, mode: str, agents: int, steps: int, repeats: int) -> list[Row]:
    """Steps/s of agents that open their workflows against agents that start them."""
    figures: dict[str, list[Figure]] = {how: [] for how in ("start", *OPENS)}
    for _ in range(repeats):
        for how in figures:
            settings = fresh_settings(servers)
            figures[how].append(stepledger_figure(settings, mode, agents, steps, how))
    started = _median(figures["start"])
    rows = []
    for how in OPENS:
        opened = _median(figures[how])
        rows.append(
            Row(
                "concurrency",
                f"{agents} agents ({mode}): {how} id, steps/s (vs start)",
                opened.steps_per_s,
                started.steps_per_s,
                "steps/s",
                ">=0.9",
            )
        )
        print(f"[concurrency] {rows[-1].name}: {rows[-1].ratio:.2f}", flush=True)
    return rows


def _rows(agents: int, mode: str, ours: Figure, floor: Figure, variant: str = "") -> list[Row]:
    label = f"{agents} agent{'s' if agents > 1 else ''} ({mode}{variant})"
    print(
        f"[concurrency] {label}: {ours.steps_per_s:,.0f} steps/s at {ours.cpu_us:,.0f} us/step "
        f"(broker {ours.broker_us:,.0f}); raw {floor.steps_per_s:,.0f} steps/s at "
        f"{floor.cpu_us:,.0f} us/step (broker {floor.broker_us:,.0f})",
        flush=True,
    )
    return [
        Row(
            "concurrency",
            f"{label}, steps/s (vs raw two-acks floor)",
            ours.steps_per_s,
            floor.steps_per_s,
            "steps/s",
            ">=0.5" if agents >= 8 else "",
        ),
        Row(
            "concurrency",
            f"{label}, client CPU per step (vs raw client)",
            ours.cpu_us,
            floor.cpu_us,
            "us",
            "<=2" if agents >= 8 else "",
            False,
        ),
        *(
            [
                Row(
                    "concurrency",
                    f"{label}, broker CPU per step (vs the broker's for raw)",
                    ours.broker_us,
                    floor.broker_us,
                    "us",
                    higher_is_better=False,
                )
            ]
            if BROKERS
            else []
        ),
    ]


if __name__ == "__main__":
    cli(run, __doc__)

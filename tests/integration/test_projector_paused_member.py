"""A projector paused past its session gives its partitions back; nobody stops for good.

Three ``stepledger project`` processes in one group share a shard directory while events
stream into every partition.  One of them is SIGSTOPped past its session: the group hands
its partitions to the other two, whose shards it still holds locked (DuckDB's lock is the
fence).  The new owners must not wait for the lock inside their assignment callbacks (a
member blocked there projects none of its other partitions and answers no rebalance); they
hold the partitions paused and take them once the lock is free.  Continued (SIGCONT), the
paused one must find that it lost its partitions and let their locks go.  After it: all
three still run, every partition is projected by exactly one of them, and the shards
together equal a rebuild of the log.  Run on Apache Kafka and on Tansu.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from stepledger.config import Settings
from stepledger.domain.factory import EventFactory
from stepledger.log import event_headers
from stepledger.projector.rebuild import rebuild as rebuild_file
from stepledger_dev.broker import free_port
from tests.conftest import Factory
from tests.integration.projector_helpers import (
    CODEC,
    produce_events,
    producer,
    projected,
    projector_command,
    wait_for,
)
from tests.integration.test_rebuild_shards import union_contents
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log

PARTITIONS = 6
SESSION_S = 6
#: How long every member must still run after the paused one is continued: several of a
#: held shard's retries and its first warning (a new owner once exited after waiting for a
#: lock in its assignment callback; no such wait is left, so a short watch catches one that
#: comes back).
ALIVE_AFTER_S = 12.0
#: The longest a member that was handed a locked shard may go without projecting one of
#: the events that keep arriving in its other partitions (a lock wait in the assignment
#: callback stalled it for the whole wait, 5 s and more).
STALL_S = 3.0


class Member:
    """One projector process of the group, with its metrics endpoint and log file."""

    def __init__(self, settings: Settings, shards: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log
        command = projector_command(
            settings,
            shards,
            *("--session-timeout", str(SESSION_S), "--snapshot-interval", "0.3"),
            *("--metrics-port", str(self.port)),
        )
        with open(log, "w") as err:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True)

    def metric(self, name: str) -> float | None:
        """One sample of the member's metrics (None while it cannot be asked)."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return None
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(found[1]) if found else None

    def owned(self) -> tuple[set[int], set[int]]:
        """The partitions assigned here and those of them held back, as its log tells."""
        assigned: set[int] = set()
        held: set[int] = set()
        for line in self.log.read_text().splitlines():
            if (found := re.search(r" INFO assigned (.*)$", line)) is not None:
                for partition, back in re.findall(r"\[(\d+)\]( \(held back\))?", found[1]):
                    assigned.add(int(partition))
                    (held.add if back else held.discard)(int(partition))
            elif found := re.search(r" (?:INFO revoked|WARNING lost) (.*?)(?::|$)", line):
                gone = {int(p) for p in re.findall(r"\[(\d+)\]", found[1])}
                assigned -= gone
                held -= gone
            elif (found := re.search(r"\[(\d+)\] released: projecting", line)) is not None:
                held.discard(int(found[1]))
        return assigned, held

    def projecting(self) -> set[int]:
        """The partitions this member projects now (assigned, not held back)."""
        assigned, held = self.owned()
        return assigned - held

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


class Trickle:
    """Events into every partition in turn, from a thread, until stopped."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out = producer(self.settings)
        events = EventFactory("fleet", "trickle")
        for n in itertools.count():
            if self.stop.wait(0.05):
                break
            event = events.workflow_started(
                f"trickle-{n:05d}", name="trickle", attempt=1, read_only=False, max_attempts=3
            )
            out.produce(
                self.settings.topic,
                CODEC.encode(event),
                event.workflow_id.encode(),
                partition=n % PARTITIONS,
                headers=event_headers(event),  # type: ignore[arg-type]
            )
            out.poll(0)
            self.sent += 1
        assert out.flush(30) == 0

    def end(self) -> int:
        """Stop and return how many events were sent."""
        self.stop.set()
        self.thread.join(60)
        return self.sent


class Stalls:
    """Samples each member's projected-events counter; the longest time it stood still."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.samples: list[list[tuple[float, float]]] = [[] for _ in members]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for member, samples in zip(self.members, self.samples, strict=True):
                value = member.metric("stepledger_projector_events_total")
                if value is not None:
                    samples.append((time.monotonic(), value))

    def longest(self, index: int, since: float, until: float) -> float:
        """The longest the member's counter stood still inside [since, until] (seconds)."""
        self.stop.set()
        self.thread.join(10)
        moved = [t for t, v in _changes(self.samples[index]) if since <= t <= until]
        points = [since, *moved, until]
        return max(b - a for a, b in itertools.pairwise(points))


def _changes(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(t, v) for (_, u), (t, v) in itertools.pairwise(samples) if v != u]


def _each_projected_by_one(members: list[Member]) -> bool:
    """Every partition projected by exactly one member, none held back, every member busy."""
    gauge = "stepledger_projector_partitions_held"
    if any(m.metric(gauge) != 0 or not m.projecting() or m.owned()[1] for m in members):
        return False
    counts = [p for m in members for p in m.projecting()]
    return sorted(counts) == list(range(PARTITIONS))


def test_a_member_paused_past_its_session_gives_its_shards_back_and_all_run_on(
    make_settings: Factory, tmp_path: Path
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    shards = tmp_path / "shards"
    first_events = random_log(seed=51, workflows=30)
    produce_events(settings, first_events)
    members = [Member(settings, shards, tmp_path / f"member-{i}.log") for i in range(3)]
    trickle: Trickle | None = None
    try:
        wait_for(lambda: projected(shards) >= len(first_events), 120, "the first events")
        wait_for(lambda: _each_projected_by_one(members), 120, "a stable group of three")
        paused, others = members[0], members[1:]
        lost = paused.projecting()
        trickle, stalls = Trickle(settings), Stalls(others)
        stopped = time.monotonic()
        os.kill(paused.proc.pid, signal.SIGSTOP)
        # Past its session the group gives its partitions to the other two: held back.
        wait_for(
            lambda: lost <= set().union(*(o.owned()[0] for o in others)),
            90,
            "the paused member's partitions assigned to the others",
        )
        time.sleep(2.0)  # the others project on while the shards stay locked
        os.kill(paused.proc.pid, signal.SIGCONT)
        continued = time.monotonic()
        for index, member in enumerate(others):
            stood = stalls.longest(index, stopped, continued)
            assert stood < STALL_S, f"projected nothing for {stood:.1f}s\n{member.tail()}"
        wait_for(
            lambda: " WARNING lost " in paused.log.read_text(),
            60,
            "the continued member to find its partitions lost",
        )
        wait_for(lambda: _each_projected_by_one(members), 120, "each partition projected once")
        total = len(first_events) + trickle.end()
        wait_for(lambda: projected(shards) == total, 120, "every event projected")
        # Nobody exits later for a lock another held: every member runs on.
        while time.monotonic() - continued < ALIVE_AFTER_S:
            for member in members:
                assert member.proc.poll() is None, member.tail()
            time.sleep(0.5)
        # A member's late rejoin may move partitions once more in the watch: they settle.
        wait_for(lambda: _each_projected_by_one(members), 60, "each partition projected once")
        for member in members:
            member.proc.send_signal(signal.SIGTERM)
        for member in members:
            assert member.proc.wait(60) == 0, member.tail()
            assert "Traceback" not in member.log.read_text(), member.tail()
    finally:
        if trickle is not None:
            trickle.end()
        for member in members:
            if member.proc.poll() is None:
                os.kill(member.proc.pid, signal.SIGCONT)
                member.proc.kill()
                member.proc.wait(10)
    rebuilt = tmp_path / "rebuilt.duckdb"
    rebuild_file(settings, rebuilt)
    assert union_contents(shards) == table_contents(rebuilt)

"""A partition the recovery daemon calls caught up has every record before its end tracked.

``RecoveryDaemon.caught_up`` is read from other threads (an embedding program, the bench's
restart measurement).  A daemon restarted from its checkpoint used to publish a partition
as caught up when the poll that brought its end also brought the tail's records, before
folding those records in: a reader saw the tracker half a batch behind (an intent of the
tail open, its outcome not read yet: one open intent too many).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.events import Event
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.log import KafkaEventLog
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.unit.factories import pay_tool

KEPT_OPEN = 30
"""Intents that stay open (their deadline is an hour away) across the restart."""


class _Published(set[int]):
    """The daemon's caught-up set, noting the tracker's state as each partition joins it."""

    def __init__(self, daemon: RecoveryDaemon) -> None:
        super().__init__()
        self.daemon = daemon
        self.positions: dict[int, int | None] = {}
        self.open_when_all: int | None = None
        self.all = threading.Event()

    def update(self, *others: Iterable[int]) -> None:
        items = set().union(*others)
        tracker = self.daemon.tracker
        for partition in items - self:
            self.positions[partition] = tracker.positions.get(partition)
        super().update(items)
        assigned = self.daemon.assigned
        if assigned and assigned <= self and not self.all.is_set():
            self.open_when_all = tracker.open_count()
            self.all.set()


def _send(settings: Settings, events: list[Event], ends: dict[int, int]) -> None:
    log = KafkaEventLog(settings)
    try:
        for position in [wait() for wait in [log.send(e) for e in events]]:
            ends[position.partition] = max(ends.get(position.partition, 0), position.offset + 1)
    finally:
        log.close()


def _settled(factory: EventFactory, tool: Tool, n: int, prefix: str) -> list[Event]:
    events = []
    for i in range(n):
        wf = f"{prefix}-{i}"
        events += [
            factory.workflow_started(wf, name="", attempt=1, read_only=False, max_attempts=3),
            factory.intent(wf, "s", tool, {"i": i}, sequence=0),
            factory.outcome(wf, "s", attempt=1, status=OutcomeStatus.SUCCEEDED, result={"i": i}),
        ]
    return events


def _run_until_caught_up(settings: Settings, state: Path, tools: ToolRegistry) -> _Published:
    options = DaemonOptions(
        state_dir=state, grace_s=0.0, workers=2, consumer={"fetch.wait.max.ms": 10}
    )
    daemon = RecoveryDaemon(settings, tools, options, dead_letters=MemoryEventLetters())
    published = _Published(daemon)
    daemon.caught_up = published
    thread = threading.Thread(target=daemon.run, kwargs={"max_seconds": 120.0}, daemon=True)
    thread.start()
    try:
        assert published.all.wait(timeout=90), "the daemon did not catch up"
    finally:
        daemon.shutdown.request()
        thread.join(timeout=60)
    assert not thread.is_alive()
    return published


def test_a_restarted_daemon_is_caught_up_only_with_the_tail_tracked(
    settings: Settings, tmp_path: Path
) -> None:
    tool = pay_tool(timeout_s=3600)
    tools = ToolRegistry([tool])
    factory = EventFactory("test-fleet", "agent")
    ends: dict[int, int] = {}
    opened = [
        factory.intent(f"open-{i}", "s", tool, {"i": i}, sequence=0) for i in range(KEPT_OPEN)
    ]
    _send(settings, _settled(factory, tool, 100, "old") + opened, ends)

    first = _run_until_caught_up(settings, tmp_path, tools)
    assert first.positions == ends
    assert first.open_when_all == KEPT_OPEN

    # The tail read after the restart: workflows whose intents are settled in the same tail.
    _send(settings, _settled(factory, tool, 150, "new"), ends)
    second = _run_until_caught_up(settings, tmp_path, tools)
    assert second.positions == ends, "caught up before the tail was folded in"
    assert second.open_when_all == KEPT_OPEN

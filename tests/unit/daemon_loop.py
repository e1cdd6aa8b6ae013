"""A recovery daemon's loop driven by a test on an in-memory log, its clock moved by hand.

Every event appended is fed to the loop (``feed``); ``turn`` is one pass of the daemon's own
loop (dispatch what is due, collect what finished, read echoes); ``until`` turns it, the
clock moving a step a turn, until a condition holds (bounded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.tools import Tool
from stepledger.history.memory import InMemoryHistory
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.unit.factories import T0, LogStartAtZero


class Now:
    """The daemon's clock (an hour past the agents'), moved on by the test."""

    def __init__(self) -> None:
        self.now = T0 + timedelta(hours=1)

    def __call__(self) -> datetime:
        return self.now


def hold_partition(daemon: RecoveryDaemon) -> RecoveryDaemon:
    """``daemon`` with partition 0 of ``log`` its own and read to its end, on a log whose
    head was never deleted (no broker to ask)."""
    daemon._log_start = LogStartAtZero(daemon.settings)
    daemon._on_assign([])
    daemon.caught_up.add(0)
    daemon.fence.assigned({0})
    daemon.fence.polled()
    return daemon


class DaemonLoop:
    """A recovery daemon on ``log`` (read back through the in-memory history), partition 0
    of topic ``log`` its own; ``restore``: it takes the partition from ``store`` as a
    daemon given it by the group does, else it starts with the partition already held."""

    def __init__(
        self,
        tmp_path: Path,
        tool: Tool,
        *,
        grace: timedelta,
        log: InMemoryEventLog | None = None,
        store: InMemoryCheckpointStore | None = None,
        restore: bool = True,
        turns: int = 100,
    ) -> None:
        self.log = InMemoryEventLog() if log is None else log
        self.clock, self.codec, self.turns = Now(), Codec(), turns
        self.daemon = daemon = RecoveryDaemon(
            Settings(bootstrap="127.0.0.1:9", topic="log"),
            ToolRegistry([tool]),
            DaemonOptions(state_dir=tmp_path, workers=2, grace_s=grace.total_seconds()),
            log=self.log,
            store=InMemoryCheckpointStore() if store is None else store,
            dead_letters=MemoryEventLetters(),
            clock=self.clock,
            reader=InMemoryHistory(self.log),
        )
        if restore:
            daemon._log_start = LogStartAtZero(daemon.settings)  # no broker: nothing deleted
            daemon._on_assign([("log", 0)])
            self.fed = daemon.tracker.positions.get(0, 0)
            daemon.caught_up.add(0)
            daemon.fence.polled()
        else:
            hold_partition(daemon)
            self.fed = 0

    def feed(self) -> None:
        for offset in range(self.fed, len(self.log.events)):
            value = self.codec.encode(self.log.events[offset])
            self.daemon._handle(Consumed("log", 0, offset, None, value))
        self.fed = len(self.log.events)

    def turn(self) -> None:
        """One turn of the loop: hand out what is due, take in what finished, read echoes."""
        self.daemon.fence.polled()
        self.daemon._dispatch()
        self.daemon._collect(wait=0.05)
        self.feed()

    def until(self, condition: Callable[[], bool], step: timedelta) -> bool:
        """Turn the loop, the clock moving ``step`` a turn, until ``condition`` (bounded)."""
        pause = threading.Event()
        for _ in range(self.turns):
            if condition():
                return True
            self.clock.now += step
            self.turn()
            pause.wait(0.005)
        return condition()

    def close(self) -> None:
        self.daemon.work.shutdown(wait=True)

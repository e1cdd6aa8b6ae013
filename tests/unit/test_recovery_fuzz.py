"""Schema-valid random events through the real recovery daemon's handling, without a broker.

The daemon object is the one ``stepledger recover`` runs, on an in-memory log, in-memory dead
letters and a real SQLite checkpoint.  Thousands of fuzzed records (values at and past their
types' ranges, huge and empty strings, every kind in random order on a few steps) are fed
through its record handling, its dispatching of due work and its checkpoints, and a fresh
daemon takes the partition over from that checkpoint: nothing may raise.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.history.memory import InMemoryHistory
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.fuzz_events import EventFuzzer
from tests.unit.factories import LogStartAtZero

LATE = datetime(9000, 1, 1, tzinfo=UTC)  # everything ordinary is due by then


def _record(value: bytes | None, partition: int, offset: int) -> Consumed:
    """A record as the daemon is handed it (no broker stamp)."""
    return Consumed("t", partition, offset, None, value)


def fuzz_tools(seed: int) -> ToolRegistry:
    """Tools under the names the fuzzer draws, with hooks that answer, refuse or raise."""
    rng = random.Random(seed)

    def answer(*_: Any) -> Any:
        roll = rng.random()
        if roll < 0.3:
            raise RuntimeError("hook failed")
        return NotFound("no record") if roll < 0.6 else Found({"ok": True})

    def compensate(*_: Any) -> Any:
        if rng.random() < 0.3:
            raise RuntimeError("undo failed")
        return {"undone": True}

    return ToolRegistry(
        [
            Tool(name="pay", effect="idempotent", policy="query", keyed=True, query=answer),
            Tool(name="book", effect="compensatable", query=answer, compensate=compensate),
            Tool(name="a", effect="idempotent", keyed=True, run=lambda a, k: {"re": k}),
            Tool(name="b", effect="irreversible", query=answer),
        ]
    )


def daemon(tmp_path: Path, seed: int, store: InMemoryCheckpointStore) -> RecoveryDaemon:
    options = DaemonOptions(state_dir=tmp_path, workers=2, claim_timeout_s=0.01, grace_s=0.0)
    settings = Settings(bootstrap="127.0.0.1:9", topic="fuzz")
    log = InMemoryEventLog()
    daemon = RecoveryDaemon(
        settings,
        fuzz_tools(seed),
        options,
        log=log,
        store=store,
        dead_letters=MemoryEventLetters(),
        clock=lambda: LATE,
        reader=InMemoryHistory(log),  # reopened steps are read back with no broker
    )
    daemon._log_start = LogStartAtZero(daemon.settings)  # no broker: nothing deleted
    return daemon


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzzed_events_never_stop_the_daemon_its_checkpoint_or_a_take_over(
    tmp_path: Path, seed: int
) -> None:
    store = InMemoryCheckpointStore()  # the changelog's stand-in, shared by both owners
    first = daemon(tmp_path, seed, store)
    first._on_assign([])
    first.caught_up.add(0)
    first.fence.assigned({0})
    fuzzer = EventFuzzer(seed, workflows=6, steps=3, past_range=0.05)
    for offset, value in enumerate(fuzzer.values(1500)):
        first._handle(_record(value, 0, offset))
        if offset % 100 == 99:
            first.fence.polled()
            first._dispatch()
            first._collect(wait=5.0)
            first.checkpoint(sweep=offset % 500 == 499)
    first._collect(wait=10.0)
    first.checkpoint(sweep=True)
    assert first.tracker.positions[0] == 1500
    decided = {e.type for e in first.log.events}  # type: ignore[attr-defined]
    assert "resolution_attempted" in decided, "the fuzz reached the resolver"
    tracked = len(first.tracker.steps)
    first.work.shutdown(wait=True)
    first.store.close()
    # Another daemon takes the partition over from the checkpoint the first one left.
    second = daemon(tmp_path, seed, store)
    resume_at = second.tracker.load(0, second.store.load("fuzz", 0))
    assert resume_at == 1500
    assert len(second.tracker.steps) <= tracked + len(second.tracker.unloadable)
    second.caught_up.add(0)
    second.fence.assigned({0})
    second.fence.polled()
    second._dispatch()
    second._collect(wait=10.0)
    second.work.shutdown(wait=True)
    second.store.close()

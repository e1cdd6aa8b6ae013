"""The daemon's workers go on to the next due step while a resolution's last events are
acknowledged (one thread waits for them in order): a burst of due intents is no longer
worked off one broker round trip per step and worker.  A resolution still counts as running
until every event it sent is acknowledged, and a refused one fails that resolution only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import replay
from stepledger.domain.tools import Found, Tool
from stepledger.errors import DurabilityError
from stepledger.kafka import Position
from stepledger.kafka.records import Consumed
from stepledger.log import Acknowledgement, InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolver
from tests.unit.factories import T0, LogStartAtZero, factory

PAY = Tool(name="pay", keyed=True, policy="query", query=lambda a, k: Found({"ok": k}))
WAIT_S = 10.0


class GatedAcks(InMemoryEventLog):
    """Sends are acknowledged only once the gate opens; a refused workflow's are refused."""

    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.refuse = refuse
        self.sent: list[ev.Event] = []
        self._changed = threading.Condition()

    def send(self, event: ev.Event) -> Acknowledgement:
        with self._changed:
            self.sent.append(event)
            self._changed.notify_all()

        def acknowledged() -> Position:
            assert self.gate.wait(WAIT_S), "never acknowledged"
            if event.workflow_id == self.refuse:
                raise DurabilityError("record not acknowledged: refused")
            return self.append(event)

        return acknowledged

    def wait_sent(self, count: int) -> bool:
        """Wait until ``count`` events were sent (False if they were not in time)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.sent) >= count, WAIT_S)


class Later:
    """The daemon's clock: an hour after the intents, then (``advance``) past their anchors."""

    def __init__(self) -> None:
        self.now = T0 + timedelta(hours=1)

    def __call__(self) -> datetime:
        return self.now


def _daemon(tmp_path: Path, log: GatedAcks, clock: Later) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([PAY]),
        DaemonOptions(state_dir=tmp_path, workers=1, grace_s=0.0),
        log=log,
        store=InMemoryCheckpointStore(),
        dead_letters=MemoryEventLetters(),
        clock=clock,
    )
    daemon._log_start = LogStartAtZero(daemon.settings)  # no broker: nothing deleted
    daemon._on_assign([])
    daemon.caught_up.add(0)
    daemon.fence.assigned({0})
    daemon.fence.polled()
    return daemon


def _due(daemon: RecoveryDaemon, clock: Later, workflows: list[str]) -> None:
    events, codec = factory(), Codec()
    for offset, wf in enumerate(workflows):
        value = codec.encode(events.intent(wf, "s", PAY, {"n": offset}, sequence=0))
        daemon._handle(Consumed("log", 0, offset, None, value))
    # Read with no broker stamp: deadlines are anchored on the daemon's clock when read.
    clock.now += timedelta(hours=1)


def _until(condition: Callable[[], bool]) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


def test_one_worker_goes_on_to_the_next_step_before_the_first_is_acknowledged(
    tmp_path: Path,
) -> None:
    log, clock = GatedAcks(), Later()
    daemon = _daemon(tmp_path, log, clock)
    _due(daemon, clock, ["wf-1", "wf-2", "wf-3"])
    daemon._dispatch()
    # One worker, nothing acknowledged yet: every step's decision is already on its way.
    assert log.wait_sent(6), f"only {len(log.sent)} events sent before any acknowledgement"
    daemon._collect()
    assert len(daemon.work.inflight) == 3, "a resolution finished before its acknowledgements"
    assert all(t.busy for _, t in daemon.tracker)
    log.gate.set()
    daemon._collect(wait=WAIT_S)
    assert not daemon.work.inflight
    assert [t.echo_offset for _, t in daemon.tracker] == [1, 3, 5]
    assert not any(t.busy for _, t in daemon.tracker)
    daemon.work.shutdown(wait=True)


def test_a_refused_acknowledgement_fails_its_own_resolution_only(tmp_path: Path) -> None:
    log, clock = GatedAcks(refuse="wf-1"), Later()
    daemon = _daemon(tmp_path, log, clock)
    _due(daemon, clock, ["wf-1", "wf-2"])
    daemon._dispatch()
    assert log.wait_sent(4)
    log.gate.set()
    daemon._collect(wait=WAIT_S)
    assert _until(lambda: not daemon.work.inflight)
    refused, resolved = daemon.tracker.steps[("wf-1", "s")], daemon.tracker.steps[("wf-2", "s")]
    # Refused: back-off, judged again later (its echo is not awaited); resolved: awaited.
    assert refused.echo_offset == -1 and refused.not_before is not None
    assert resolved.echo_offset >= 0 and resolved.not_before is None
    assert [e.workflow_id for e in log.events] == ["wf-2", "wf-2"]
    daemon.work.shutdown(wait=True)


def test_the_resolver_begins_an_attempt_and_leaves_its_last_acknowledgements_to_the_caller() -> (
    None
):
    log = GatedAcks()
    events = EventFactory("f", "recovery", lambda: T0 + timedelta(hours=1))
    intent = factory().intent("wf", "s", PAY, {"n": 1}, sequence=0)
    resolver = Resolver(
        log, events, ToolRegistry([PAY]), clock=lambda: T0 + timedelta(hours=1), pipeline=True
    )
    settle = resolver.begin(replay("wf", [intent]), "s")
    assert [e.type for e in log.sent] == ["resolution_attempted", "step_outcome"]
    assert log.events == []
    log.gate.set()
    resolution = settle()
    assert [p.offset for p in resolution.positions] == [0, 1]

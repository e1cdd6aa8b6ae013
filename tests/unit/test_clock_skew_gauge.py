"""The recovery daemon's clock-skew gauge says nothing until it knows something.

Measured on a fresh stack: right after a restart the gauge exported -158.6 s, a false
alarm.  The restarted daemon read its backlog: an intent appended minutes before was read
now, so the producer looked minutes behind, with broker time too (every lead sample of a
catch-up is late by as much).  Now only a sure estimate counts (a producer ahead, or an
intent read while its partition was caught up), and the gauge is NaN until one exists.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.events import MemoryEventLetters
from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.kafka.records import Consumed
from stepledger.log import InMemoryEventLog
from stepledger.recovery.checkpoint import InMemoryCheckpointStore
from stepledger.recovery.clock import LOG_APPEND_TIME
from stepledger.recovery.daemon import RecoveryDaemon
from stepledger.recovery.metrics import RecoveryMetrics
from stepledger.recovery.options import DaemonOptions
from stepledger.resolution.registry import ToolRegistry
from tests.unit.factories import T0, LogStartAtZero
from tests.unit.test_daemon_steady_clock import PAY, Host

GAUGE = "stepledger_recovery_clock_skew_seconds"


def _restarted(tmp_path: Path, host: Host) -> RecoveryDaemon:
    daemon = RecoveryDaemon(
        Settings(bootstrap="127.0.0.1:9", topic="log"),
        ToolRegistry([PAY]),
        DaemonOptions(state_dir=tmp_path, workers=1),
        log=InMemoryEventLog(),
        store=InMemoryCheckpointStore(),
        dead_letters=MemoryEventLetters(),
        clock=host.wall,
        timer=host.timer,
    )
    daemon._log_start = LogStartAtZero(daemon.settings)
    daemon._on_assign([])
    daemon.fence.assigned({0})
    return daemon  # partition 0 is not caught up: what it reads first is its backlog


def _skew(daemon: RecoveryDaemon) -> float | None:
    return daemon.metrics.registry.get_sample_value(GAUGE)


def _intent(producer: str, step: str, occurred: timedelta) -> ev.Event:
    agent = EventFactory("fleet", producer, lambda: T0 + occurred)
    return agent.intent("wf-" + step, step, PAY, {"amount": 1}, sequence=0)


def _read(daemon: RecoveryDaemon, offset: int, event: ev.Event, appended: timedelta) -> None:
    millis = int((T0 + appended).timestamp() * 1000)
    record = Consumed(
        "log", 0, offset, None, Codec().encode(event), timestamp=(LOG_APPEND_TIME, millis)
    )
    daemon._handle(record)


def test_the_gauge_is_nan_before_any_intent() -> None:
    assert math.isnan(RecoveryMetrics().registry.get_sample_value(GAUGE) or 0.0)


def test_a_backlog_read_after_a_restart_exports_no_skew(tmp_path: Path) -> None:
    host = Host()
    host.passes(timedelta(seconds=158.6))  # the daemon restarts 158.6 s after the intent
    daemon = _restarted(tmp_path, host)
    # An agent in sync with everyone wrote it at T0; the broker stamped it then.
    _read(daemon, 0, _intent("agent", "a", timedelta(0)), timedelta(0))
    skew = _skew(daemon)
    assert skew is not None and math.isnan(skew), f"a backlog read exported {skew}"
    assert daemon.deadlines.largest() is None


def test_an_intent_read_as_it_came_is_measured_and_a_lead_always(tmp_path: Path) -> None:
    host = Host()
    host.passes(timedelta(seconds=158.6))
    daemon = _restarted(tmp_path, host)
    # A producer 30 s ahead is sure even in a backlog: a late read only makes it look behind.
    _read(daemon, 0, _intent("ahead", "a", timedelta(seconds=190)), timedelta(0))
    assert _skew(daemon) == pytest.approx(190 - 158.6, abs=0.01)
    daemon.caught_up.add(0)
    now = host.timer.now - 1000.0  # seconds since T0 on the host
    behind = _intent("behind", "b", timedelta(seconds=now - 40))
    _read(daemon, 1, behind, timedelta(seconds=now))
    assert daemon.deadlines.skew["behind"] == pytest.approx(-40.0, abs=0.01)
    assert _skew(daemon) == pytest.approx(-40.0, abs=0.01)

"""A Ledger's own monotonic clock and hook pool: the runner's budget, settling's waits and its
recovery hooks go through them (what lets one process simulate many)."""

from __future__ import annotations

from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain.enums import ResolutionPolicy
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import StepInDoubtError
from stepledger.producer import Ledger
from stepledger.producer.session import ResumeOptions
from stepledger.resolution.hooks import HookPool
from stepledger.testing import Crash, InMemoryEventLog, ManualClock


class FakeTimer:
    """A monotonic clock that moves only when told to; its sleeps move it (and a wall clock)."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.clock = clock

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.clock is not None:
            self.clock.advance(seconds)


class CountingPool(HookPool):
    """Runs hooks at once and counts them."""

    def __init__(self) -> None:
        super().__init__(size=0)
        self.names: list[str] = []

    def call(self, hook: Any, args: tuple[Any, ...], timeout: float, name: str) -> Any:
        self.names.append(name)
        return hook(*args)


def _ledger(
    log: InMemoryEventLog,
    clock: ManualClock,
    timer: FakeTimer,
    *tools: Tool,
    hooks: HookPool | None = None,
) -> Ledger:
    return Ledger(
        Settings(fleet_id="test", producer_id="test"),
        log=log,
        clock=clock,
        tools=tools,
        options=ResumeOptions(grace_s=0.0, resolve_timeout_s=30),
        timer=timer,
        hooks=hooks,
    )


def test_a_call_past_its_budget_by_the_ledgers_timer_is_refused() -> None:
    calls: list[str] = []
    email = Tool(name="email", timeout_s=5.0, run=lambda a, k: calls.append(k))
    log, clock, timer = InMemoryEventLog(), ManualClock(), FakeTimer()
    wf = _ledger(log, clock, timer).workflow("w1")

    def paused(step_id: str) -> None:
        timer.now += 6.0  # the process was paused past the timeout; its wall clock was not read

    wf.after_intent = paused
    with pytest.raises(StepInDoubtError, match="deadline"):
        wf.step("email", email, to="a@example.test")
    assert calls == []


def test_settling_waits_on_the_ledgers_timer_and_runs_hooks_on_its_pool() -> None:
    found: list[str] = []

    def query(args: dict[str, Any], key: str) -> Found | NotFound:
        found.append(key)
        return NotFound("no charge")

    def crash(args: dict[str, Any], key: str) -> Any:
        raise Crash

    charge = Tool(
        name="charge",
        keyed=True,
        policy=ResolutionPolicy.QUERY,
        timeout_s=5.0,
        run=crash,
        query=query,
    )
    log, clock = InMemoryEventLog(), ManualClock()
    first = _ledger(log, clock, FakeTimer(), charge).workflow("w1")
    with pytest.raises(Crash):
        first.step("charge", charge, amount=1)
    timer, pool = FakeTimer(clock), CountingPool()
    resumed = _ledger(log, clock, timer, charge, hooks=pool).workflow("w1")
    step = resumed.state.steps["charge"]
    assert step.status.value == "not_happened"
    assert sum(timer.slept) >= 4.0  # waited out the deadline on its own timer, not time.sleep
    assert pool.names and all(n == "charge.query" for n in pool.names)
    assert len(found) == len(pool.names)

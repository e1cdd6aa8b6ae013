"""The hook pool grows to the calls under way at once, whatever its threads look like.

It used to grow only when no thread counted itself idle, and a thread counted itself idle
until it ran again: a thread woken for one call but not yet running (waiting for the GIL)
let the next call queue behind it.  In a burst, eight workers' queries went through one
thread, one interpreter hand-off after another (the daemon's capacity halved).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from stepledger.resolution.hooks import HookPool

WAIT_S = 5.0


class SlowToWake(queue.SimpleQueue[Any]):
    """A queue whose first taker after ``arm`` is held, job in hand, until a second put."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = self.holding = False
        self.second = threading.Event()
        self._puts = 0

    def arm(self) -> None:
        self.counting = self.holding = True

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item)
        if self.counting:
            self._puts += 1
            if self._puts == 2:
                self.second.set()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get()
        if self.holding:
            self.holding = False
            self.second.wait(WAIT_S)  # woken with a job, not yet running it
        return item


def test_two_calls_at_once_run_at_once_even_when_the_idle_thread_is_slow_to_wake() -> None:
    pool = HookPool()
    slow = SlowToWake()
    pool._queue = slow
    assert pool.call(lambda: "warm", (), WAIT_S, "warm") == "warm"  # one thread, idle now
    both = threading.Barrier(2, timeout=WAIT_S)
    answers: list[Any] = []

    def together() -> str:
        both.wait()  # each call's hook runs only once the other one runs too
        return "ok"

    slow.arm()
    callers = [
        threading.Thread(target=lambda: answers.append(pool.call(together, (), WAIT_S, "q")))
        for _ in range(2)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(2 * WAIT_S)
    assert answers == ["ok", "ok"]
    assert pool.threads == 2


def test_calls_one_after_another_use_one_thread() -> None:
    pool = HookPool()
    for i in range(20):
        assert pool.call(lambda n: n, (i,), WAIT_S, "one") == i
    assert pool.threads == 1


class SlowOnWorkers:
    """The pool's lock, slow to take on its own threads: widens the moment between a call
    ending and the pool counting it ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        if threading.current_thread().name == "hook":
            time.sleep(0.05)
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_call_is_counted_ended_before_its_caller_wakes() -> None:
    """The caller was woken before the pool counted its call ended: its next call, made at
    once, saw one call under way and started a second thread for a lone caller."""
    pool = HookPool()
    pool._lock = SlowOnWorkers()  # type: ignore[assignment]
    for i in range(5):
        assert pool.call(lambda n: n, (i,), WAIT_S, "one") == i
    assert pool.threads == 1

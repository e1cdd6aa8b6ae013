"""Calling a tool's recovery hooks: bounded by the tool's timeout, arguments from the intent."""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from stepledger.domain.state import StepState
from stepledger.domain.tools import Found, NotFound, QueryHook
from stepledger.errors import HookTimeoutError, RecoveryError


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer


class _Job:
    """One hook call handed to the pool; cancelled if nobody picked it up in time."""

    def __init__(self, hook: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.hook, self.args = hook, args
        # Released once when the job ends: the caller sleeps on it (a lock, not an Event:
        # a Condition per wait cost more than the hand-off itself).
        self.done = threading.Lock()
        self.done.acquire()
        self.lock = threading.Lock()
        self.state = "queued"
        self.answer: Any = None
        self.error: BaseException | None = None

    def run(self, ended: Callable[[], None] | None = None) -> None:
        """Run the hook; ``ended`` is called once it ended, before its caller is woken (a
        pool counts the call finished before that caller can make its next one)."""
        with self.lock:
            if self.state == "cancelled":
                if ended is not None:
                    ended()
                return
            self.state = "running"
        try:
            answer = self.hook(*self.args)
            if inspect.isawaitable(answer):
                # An async tool's hook: run it to its end on this (loop-less) pool thread.
                answer = asyncio.run(_awaited(answer))
            self.answer = answer
        except BaseException as exc:
            self.error = exc
        finally:
            if ended is not None:
                ended()
            self.done.release()

    def cancel(self) -> bool:
        """Stop the job from starting; False if it already runs."""
        with self.lock:
            if self.state == "queued":
                self.state = "cancelled"
            return self.state == "cancelled"


class HookPool:
    """A fixed set of daemon threads running hooks, so a call pays no thread start.

    The pool grows to the number of calls under way at once (up to ``size``): a pool used
    by one caller at a time costs one thread.  A hook that hangs keeps its thread; when
    every thread hangs, new calls wait in the queue, time out and are cancelled before they
    start (counted as failed attempts), so hung hooks never multiply threads without bound
    nor run after being given up.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._unfinished = 0
        """Calls queued or running: more of them than threads and the pool grows."""

    @property
    def threads(self) -> int:
        """How many threads the pool has started."""
        return self._threads

    def call(
        self, hook: Callable[..., Any], args: tuple[Any, ...], timeout: float, name: str
    ) -> Any:
        """Run the hook on a pool thread and wait at most ``timeout`` seconds for its answer."""
        job = _Job(hook, args)
        with self._lock:
            # Counted, not guessed from threads that look idle: a thread woken for a job
            # but not yet running it looked idle, and eight callers at once were served
            # by one thread, one GIL hand-off after another.
            self._unfinished += 1
            if self._unfinished > self._threads and self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._work, name="hook", daemon=True).start()
        self._queue.put(job)
        return _answer(job, timeout, name)

    def _work(self) -> None:
        while True:
            self._queue.get().run(self._ended)

    def _ended(self) -> None:
        with self._lock:
            self._unfinished -= 1


_shared: HookPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> HookPool:
    """The process's hook pool, made on first use (every Resolver shares it by default)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = HookPool()
        return _shared


def call_bounded(hook: Callable[..., Any], args: tuple[Any, ...], timeout: float, name: str) -> Any:
    """Call a hook on a new daemon thread and wait at most ``timeout`` seconds for its answer.

    A hook still running at the timeout raises HookTimeoutError here; its thread cannot be
    killed and is left to finish (daemon, so it never keeps the process from exiting).
    """
    job = _Job(hook, args)
    threading.Thread(target=job.run, name=f"hook-{name}", daemon=True).start()
    return _answer(job, timeout, name)


def _answer(job: _Job, timeout: float, name: str) -> Any:
    if not job.done.acquire(timeout=min(max(0.0, timeout), threading.TIMEOUT_MAX)):
        job.cancel()
        raise HookTimeoutError(f"hook {name} did not answer within {timeout:g}s")
    if job.error is not None:
        raise job.error
    return job.answer


def checked_query(query: QueryHook) -> Callable[[dict[str, Any], str], Found | NotFound]:
    """Wrap a query hook so an answer that is neither Found nor NotFound is an error."""

    def run(arguments: dict[str, Any], key: str) -> Found | NotFound:
        answer = query(arguments, key)
        if not isinstance(answer, Found | NotFound):
            raise RecoveryError(f"query answered {type(answer).__name__}, not Found/NotFound")
        return answer

    return run


def intent_arguments(step: StepState) -> dict[str, Any]:
    """The intent's arguments as recorded.

    Secret fields are redacted in the log, so a hook that needs a secret must fetch it
    itself (from its own vault), never from the intent.
    """
    loaded = json.loads(step.arguments_json or "{}")
    return loaded if isinstance(loaded, dict) else {"value": loaded}


def known_result(step: StepState) -> Any:
    """The result the log knows for the step (for a compensation), or None."""
    return None if step.result_json is None else json.loads(step.result_json)

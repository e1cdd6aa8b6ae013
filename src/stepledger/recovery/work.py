"""The recovery daemon's workers: resolutions run off the loop's thread, fenced per partition.

The loop submits a resolution for a step and goes on reading the log; a worker carries it
out with every append checked against the partition's ownership
(:class:`~stepledger.recovery.fence.Fence`).  A resolution whose last events are still on
their way to the broker (:meth:`~stepledger.resolution.resolver.Resolver.begin`) is handed
to one settling thread that waits for their acknowledgements in order, so the worker goes
on to the next step instead of waiting a round trip per step; the finished future is
queued for the loop, which collects what finished without scanning what still runs.  Work
queued for a partition that moves away is cancelled; running work meets the fence.  A read
(a reopened step's workflow read back, see ``recovery.reopen``) runs on the same workers
and is collected the same way, by the handler it was submitted with; it appends nothing,
so it needs no fence.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stepledger.kafka.fence import Fence
from stepledger.recovery.tracker import StepKey, Tracked
from stepledger.resolution.resolver import Resolution, Settle

#: What the loop does with one finished (or cancelled) resolution of a step (or read).
OnFinished = Callable[[StepKey, "Future[Any]"], None]
#: What a worker runs: a resolution, or one still waiting for its acknowledgements.
Work = Callable[..., Resolution | Settle]


class WorkPool:
    """A bounded pool of resolutions in flight, each tagged with its step and partition."""

    def __init__(self, workers: int, queue_per_worker: int, fence: Fence) -> None:
        self.fence = fence
        self.capacity = max(1, workers) * max(1, queue_per_worker)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="resolve")
        self.inflight: dict[Future[Any], tuple[StepKey, int]] = {}
        self._handlers: dict[Future[Any], OnFinished] = {}
        """The handler of each read in flight (resolutions go to ``collect``'s)."""
        self._done: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()
        self._settling: queue.SimpleQueue[tuple[Future[Resolution], Settle] | None] = (
            queue.SimpleQueue()
        )
        self._settler: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        """How many more resolutions may be submitted now."""
        return self.capacity - len(self.inflight)

    def on(self, partitions: set[int]) -> bool:
        """True when a resolution of one of these partitions is queued or running."""
        return any(p in partitions for _, p in self.inflight.values())

    def submit(self, key: StepKey, tracked: Tracked, fn: Work, *args: Any) -> None:
        """Run ``fn(workflow_id, *args)`` on a worker, fenced by the step's partition."""
        tracked.busy = True
        future: Future[Resolution] = Future()
        self.inflight[future] = (key, tracked.partition)
        future.add_done_callback(self._done.put)
        self._pool.submit(self._fenced, future, tracked.partition, fn, key[0], *args)

    def read(
        self, key: StepKey, partition: int, finished: OnFinished, fn: Callable[..., Any], *args: Any
    ) -> None:
        """Run ``fn(*args)`` on a worker; the loop hands its future to ``finished``."""
        future: Future[Any] = Future()
        self.inflight[future] = (key, partition)
        self._handlers[future] = finished
        future.add_done_callback(self._done.put)
        self._pool.submit(self._read, future, fn, *args)

    @staticmethod
    def _read(future: Future[Any], fn: Callable[..., Any], *args: Any) -> None:
        if not future.set_running_or_notify_cancel():
            return  # cancelled while queued: its partition moved away
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    def _fenced(self, future: Future[Resolution], partition: int, fn: Work, *args: Any) -> None:
        # On the worker: every append this resolution makes is checked against ownership.
        if not future.set_running_or_notify_cancel():
            return  # cancelled while queued: its partition moved away
        self.fence.working_on(partition)
        try:
            done = fn(*args)
        except BaseException as exc:
            future.set_exception(exc)
            return
        finally:
            self.fence.working_on(None)
        if isinstance(done, Resolution):
            future.set_result(done)
        else:
            self._settle_later(future, done)

    def _settle_later(self, future: Future[Resolution], settle: Settle) -> None:
        if self._settler is None:
            self._start_settler()
        self._settling.put((future, settle))

    def _start_settler(self) -> None:
        with self._lock:
            if self._settler is None:
                self._settler = threading.Thread(
                    target=self._settle_loop, name="resolve-settle", daemon=True
                )
                self._settler.start()

    def _settle_loop(self) -> None:
        # Acknowledgements come back roughly in the order the events were sent: waiting
        # for them in that order costs one wake-up per resolution, and no worker waits.
        while (item := self._settling.get()) is not None:
            future, settle = item
            try:
                future.set_result(settle())
            except BaseException as exc:
                future.set_exception(exc)

    def collect(self, finished: OnFinished, *, wait: float = 0.0) -> None:
        """Hand every finished resolution to ``finished``; wait up to ``wait`` s for the rest."""
        deadline = time.monotonic() + wait
        while True:
            while not self._done.empty():
                self._finish(self._done.get_nowait(), finished)
            remaining = deadline - time.monotonic()
            if not self.inflight or remaining <= 0:
                return
            with contextlib.suppress(queue.Empty):
                self._finish(self._done.get(timeout=min(0.05, remaining)), finished)

    def _finish(self, future: Future[Any], finished: OnFinished) -> None:
        key, _ = self.inflight.pop(future)
        self._handlers.pop(future, finished)(key, future)

    def cancel(self, partitions: set[int]) -> None:
        """Cancel the work not started yet for these partitions (running work meets the fence)."""
        for future, (_, partition) in list(self.inflight.items()):
            if partition in partitions:
                future.cancel()

    def shutdown(self, *, wait: bool = False) -> None:
        """Stop the workers and the settling thread (queued work is dropped unless ``wait``)."""
        if not wait:
            for future in list(self.inflight):
                future.cancel()
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self._settling.put(None)
        if wait and self._settler is not None:
            self._settler.join()

"""The recovery daemon's workers: resolutions run off the loop's thread, fenced per partition.

The loop submits a resolution for a step and goes on reading the log; a worker runs it with
every append checked against the partition's ownership (:class:`~stepledger.recovery.fence.Fence`),
and queues the finished future, so the loop collects what finished without scanning what
still runs.  Work queued for a partition that moves away is cancelled; running work meets
the fence.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stepledger.recovery.fence import Fence
from stepledger.recovery.tracker import StepKey, Tracked
from stepledger.resolution.resolver import Resolution

#: What the loop does with one finished (or cancelled) resolution of a step.
OnFinished = Callable[[StepKey, "Future[Resolution]"], None]


class WorkPool:
    """A bounded pool of resolutions in flight, each tagged with its step and partition."""

    def __init__(self, workers: int, queue_per_worker: int, fence: Fence) -> None:
        self.fence = fence
        self.capacity = max(1, workers) * max(1, queue_per_worker)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="resolve")
        self.inflight: dict[Future[Resolution], tuple[StepKey, int]] = {}
        self._done: queue.SimpleQueue[Future[Resolution]] = queue.SimpleQueue()

    @property
    def free(self) -> int:
        """How many more resolutions may be submitted now."""
        return self.capacity - len(self.inflight)

    def on(self, partitions: set[int]) -> bool:
        """True when a resolution of one of these partitions is queued or running."""
        return any(p in partitions for _, p in self.inflight.values())

    def submit(self, key: StepKey, tracked: Tracked, fn: Any, *args: Any) -> None:
        """Run ``fn(workflow_id, *args)`` on a worker, fenced by the step's partition."""
        tracked.busy = True
        future: Future[Resolution] = self._pool.submit(
            self._fenced, tracked.partition, fn, key[0], *args
        )
        self.inflight[future] = (key, tracked.partition)
        future.add_done_callback(self._done.put)

    def _fenced(self, partition: int, fn: Any, *args: Any) -> Resolution:
        # On the worker: every append this resolution makes is checked against ownership.
        self.fence.working_on(partition)
        try:
            result: Resolution = fn(*args)
            return result
        finally:
            self.fence.working_on(None)

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

    def _finish(self, future: Future[Resolution], finished: OnFinished) -> None:
        key, _ = self.inflight.pop(future)
        finished(key, future)

    def cancel(self, partitions: set[int]) -> None:
        """Cancel the work not started yet for these partitions (running work meets the fence)."""
        for future, (_, partition) in list(self.inflight.items()):
            if partition in partitions:
                future.cancel()

    def shutdown(self, *, wait: bool = False) -> None:
        """Stop the workers (queued work is dropped)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

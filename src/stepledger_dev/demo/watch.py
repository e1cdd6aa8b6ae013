"""Following the step log while the demo runs: every event folded, new ones handed on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.errors import StepLedgerError
from stepledger.kafka.reader import read_topic

#: Step statuses that still wait for a decision (an outcome or a compensation's outcome).
UNSETTLED = frozenset({StepStatus.INTENDED, StepStatus.COMPENSATING})
_POLL_S = 0.05


class LogWatcher:
    """Follows a topic in a thread, folds its events and calls ``on_event`` for each new one."""

    def __init__(
        self, settings: Settings, on_event: Callable[[Event], None], max_time: float = 300.0
    ) -> None:
        self.settings, self.on_event, self.max_time = settings, on_event, max_time
        self.states: dict[str, WorkflowState] = {}
        self.events = 0
        self._seen: set[str] = set()
        self.error: StepLedgerError | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, name="demo-log-watcher", daemon=True)

    def start(self) -> LogWatcher:
        """Start following from the beginning of the topic."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following and close the consumer."""
        self._stop.set()
        self._thread.join(10)

    def _follow(self) -> None:
        try:
            for record in read_topic(
                self.settings,
                Codec(),
                follow=True,
                max_time=self.max_time,
                stopped=self._stop.is_set,
            ):
                if record.event is not None:
                    self._fold(record.event)
        except StepLedgerError as exc:  # the broker went away: the waits below report it
            self.error = exc

    def _fold(self, event: Event) -> None:
        # Handed on under the lock: whoever waits on a condition sees the event only after
        # ``on_event`` dealt with it (the demo's lines then come out in the log's order).
        with self._lock:
            state = self.states.setdefault(event.workflow_id, WorkflowState(event.workflow_id))
            if event.event_id in state.seen:
                return
            state.apply(event)
            self._seen.add(event.event_id)
            self.events += 1
            self.on_event(event)

    def snapshot(self) -> dict[str, WorkflowState]:
        """The workflows as folded so far (shared objects: read, do not change)."""
        with self._lock:
            return dict(self.states)

    def wait(self, condition: Callable[[dict[str, WorkflowState]], bool], timeout: float) -> bool:
        """Wait until ``condition`` holds for the folded workflows; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if condition(self.states):
                    return True
            if time.monotonic() >= deadline or self.error is not None:
                return False
            time.sleep(_POLL_S)

    def wait_seen(self, event_ids: set[str], timeout: float) -> bool:
        """Wait until every one of these events was folded in; False on timeout."""
        return self.wait(lambda _: event_ids <= self._seen, timeout)


def settled(workflow_ids: list[str]) -> Callable[[dict[str, WorkflowState]], bool]:
    """A condition: each workflow is in the log and none of its steps awaits a decision."""

    def check(states: dict[str, WorkflowState]) -> bool:
        return all(
            wf in states and not any(s.status in UNSETTLED for s in states[wf].steps.values())
            for wf in workflow_ids
        )

    return check


def reached(steps: dict[str, str]) -> Callable[[dict[str, WorkflowState]], bool]:
    """A condition: each workflow (key) has recorded an intent for its step (value)."""

    def check(states: dict[str, WorkflowState]) -> bool:
        return all(wf in states and step in states[wf].steps for wf, step in steps.items())

    return check

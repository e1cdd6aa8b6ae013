"""The in-memory :class:`~stepledger.history.protocol.WorkflowHistory` (tests, the simulator)."""

from __future__ import annotations

import time

from stepledger.domain.events import Event
from stepledger.history.protocol import History, Until
from stepledger.kafka import Position
from stepledger.log import InMemoryEventLog


class InMemoryHistory:
    """Reads workflows from an :class:`~stepledger.log.InMemoryEventLog` (which deletes nothing:
    every read is whole)."""

    def __init__(self, log: InMemoryEventLog, poll_s: float = 0.005) -> None:
        self.log = log
        self.poll_s = poll_s

    def read(self, workflow_id: str, *, through: Position | None = None) -> History:
        """Every event of the workflow in the log."""
        events = self.log.workflow_events(workflow_id)
        end = Position("memory", 0, len(self.log.events) - 1)
        return History(events, end, whole=True)

    def known(self, workflow_id: str) -> History | None:
        """None: an open here reads first (a read costs nothing)."""
        return None

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after`` up to the first accepted one (or timeout)."""
        index = 0 if after is None else after.offset + 1
        found: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while True:
            fresh = self.log.events[index:]
            index += len(fresh)
            for event in fresh:
                if event.workflow_id == workflow_id:
                    found.append(event)
                    if until(event):
                        return found
            if time.monotonic() >= deadline:
                return found
            time.sleep(self.poll_s)

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Nothing to note: the log itself is read."""

    def close(self) -> None:
        """Nothing to release."""

"""The one protocol every caller reads a workflow through, and what a read answers.

A :class:`WorkflowHistory` is made for one step log.  ``read`` answers a :class:`History`:
the workflow's events in log order, where the read ended, whether the events are the
workflow's whole history (data a caller branches on: an open that holds the whole history
without a round trip may claim first and read back through its claim), and when each event
read from the log was appended on the reader's clock (the broker's time, never the
writer's clock: a resume judges deadlines by it).  ``known`` is that answer when it costs
no round trip, or None; ``follow`` waits for the events after a position (an approval, the
recovery daemon's decision); ``wrote`` tells the history what this process recorded, so a
hint never contradicts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from stepledger.domain.events import Event
from stepledger.kafka import Position

Until = Callable[[Event], bool]


@dataclass(frozen=True)
class History:
    """One workflow's events as a read found them."""

    events: list[Event] = field(default_factory=list)
    """The workflow's events in log order."""
    position: Position | None = None
    """Where the read ended in the workflow's partition (None: not known)."""
    whole: bool = False
    """True when ``events`` are the workflow's whole history for certain, whatever the log
    deleted since (an id with no events is then proven new)."""
    appended: dict[str, datetime] = field(default_factory=dict)
    """When events of the read were appended, by event id, on the reader's clock (a later
    bound, from the broker's append time: :mod:`stepledger.history.clock`); an event the
    broker did not stamp, or read from a checkpoint or a snapshot, has none."""


@runtime_checkable
class WorkflowHistory(Protocol):
    """Reads one workflow of one step log."""

    def read(self, workflow_id: str, *, through: Position | None = None) -> History:
        """The workflow's history.

        ``through``: one of this process's acknowledged records of the workflow (its start,
        its claim); the read may end there, since everything acknowledged before it lies
        below it.  Raises HistoryExpiredError rather than answer a history whose head the
        log deleted and no checkpoint covers (such an id is never run as new).
        """
        ...

    def known(self, workflow_id: str) -> History | None:
        """The whole history as this process knows it, with no round trip (None: unknown).

        A hint: records may have landed since, so a caller acting on it records first and
        reads back through its own record.
        """
        ...

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after``, up to the first one ``until`` accepts.

        Returns early with what was read when ``timeout_s`` passes.
        """
        ...

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Note that this process recorded a claim or an end of the workflow at ``position``."""
        ...

    def close(self) -> None:
        """Release the history's clients."""
        ...

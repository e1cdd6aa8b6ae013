"""A :class:`~stepledger.history.protocol.WorkflowHistory` over a reader of the older surface.

Before the history wing a reader answered ``read(workflow_id) -> list[Event]`` (the
``WorkflowReader`` protocol users could pass as ``Ledger(reader=...)``).  Such a reader
still works: it is read as a history that is never known to be whole, so an open reads
first and a claim is read back by reading the whole workflow again.
"""

from __future__ import annotations

from typing import Protocol

from stepledger.domain.events import Event
from stepledger.history.protocol import History, Until, WorkflowHistory
from stepledger.kafka import Position


class WorkflowReader(Protocol):
    """Reads the events of one workflow, in log order (the older surface)."""

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow recorded so far."""
        ...

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after``, up to the first one ``until`` accepts."""
        ...

    def close(self) -> None:
        """Release the reader's resources."""
        ...


class ReaderHistory:
    """A history that reads through a :class:`WorkflowReader`."""

    def __init__(self, reader: WorkflowReader) -> None:
        self.reader = reader

    def read(self, workflow_id: str, *, through: Position | None = None) -> History:
        """Every event the reader returns (never known to be whole)."""
        return History(self.reader.read(workflow_id))

    def known(self, workflow_id: str) -> History | None:
        """None: the reader keeps nothing to answer from."""
        return None

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The reader's own follow."""
        return self.reader.follow(workflow_id, after, until, timeout_s)

    def wrote(self, workflow_id: str, position: Position) -> None:
        """Nothing to note."""

    def close(self) -> None:
        """Close the reader."""
        self.reader.close()


class HistoryReader:
    """The older ``read`` surface over a history (what the deprecated reader names are)."""

    def __init__(self, history: WorkflowHistory) -> None:
        self.history = history

    def read(self, workflow_id: str) -> list[Event]:
        """Every event of the workflow recorded so far."""
        return self.history.read(workflow_id).events

    def follow(
        self, workflow_id: str, after: Position | None, until: Until, timeout_s: float
    ) -> list[Event]:
        """The workflow's events after ``after``, up to the first one ``until`` accepts."""
        return self.history.follow(workflow_id, after, until, timeout_s)

    def close(self) -> None:
        """Close the history."""
        self.history.close()


def as_history(reader: WorkflowHistory | WorkflowReader) -> WorkflowHistory:
    """The history a reader handed in stands for (asked once, where it is handed in: every
    caller below reads through the protocol): itself, the one under a deprecated reader
    name, or a history over a reader of the older surface."""
    if isinstance(reader, HistoryReader):
        return reader.history
    if isinstance(reader, WorkflowHistory):
        return reader
    return ReaderHistory(reader)

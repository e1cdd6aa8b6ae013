"""The narrow things the SDK's helpers work on: a session, and what they may ask of a workflow.

A :class:`~stepledger.producer.ledger.Ledger` is a :class:`Session` (the event log, the
reader, the clock, the event factory, the tools, the options); a
:class:`~stepledger.producer.workflow.Workflow` is a :class:`WorkflowHandle`.  The helpers
(approvals, compensation, settling in-doubt steps) take these protocols rather than the
classes, so they import neither the ledger nor the workflow module and the SDK's modules
import one another in one direction only: ledger -> opening -> workflow -> helpers -> session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from stepledger.domain import events as ev
from stepledger.domain.enums import WorkflowStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.resolution import Arrival
from stepledger.domain.state import StepState, WorkflowState
from stepledger.domain.tools import Tool

if TYPE_CHECKING:
    from stepledger.config import Settings
    from stepledger.deadletters.events import EventLetterSink
    from stepledger.history.protocol import WorkflowHistory
    from stepledger.kafka import Position
    from stepledger.log import EventLog
    from stepledger.producer.fleetbudget import FleetBudgets
    from stepledger.resolution.hooks import HookPool
    from stepledger.resolution.registry import ToolRegistry
    from stepledger.timer import Timer

T = TypeVar("T")


@dataclass(frozen=True)
class ResumeOptions:
    """How workflows come back after a crash and how long the SDK waits on others."""

    grace_s: float = 0.5
    """Extra wait past an in-doubt intent's deadline before resolving it (a slow run's margin)."""
    resolve_timeout_s: float = 120.0
    """Longest a resume waits to settle one in-doubt step before raising StepInDoubtError."""
    wait_for_recovery: bool = False
    """Leave in-doubt steps to the recovery daemon and wait for its decision instead."""
    forward_query: bool = True
    """Query a compensatable in-doubt step that has a query hook instead of compensating it."""
    approval_wait_s: float = 0.0
    """How long a step waits for a human approval before raising ApprovalPendingError."""
    on_pause: Literal["raise", "wait"] = "raise"
    """What a step of a paused workflow does: raise WorkflowPausedError (nothing called),
    or wait for the unpause (up to ``pause_wait_s``, then raise).  A cancel always raises."""
    pause_wait_s: float = 3600.0
    """How long a step of a paused workflow waits for its unpause (``on_pause="wait"``)."""
    pipeline_outcomes: bool = False
    """Return from a step once its outcome is handed to the producer, not acknowledged.

    The outcome is acknowledged before the workflow's next event is (the next intent, and
    so before the next call), before any read of the log by the handle, before ``finish``
    returns; its wait overlaps the next intent's, so a step costs one round trip to the
    broker instead of two.  What changes: a crash in the round trip after ``step``
    returned leaves that step in doubt (resolved by its policy, as a crash while the tool
    returned would), and a failed acknowledgement is raised by the next call on the
    handle instead of by ``step``.  See docs/guarantees.md."""


class Session(Protocol):
    """What one process's workflows share: the log, its history, the clock and the tools."""

    @property
    def settings(self) -> Settings:
        """The settings the session was built from (record limits, topics)."""

    @property
    def log(self) -> EventLog:
        """Where events are appended durably."""

    @property
    def history(self) -> WorkflowHistory:
        """How a workflow's events are read back in log order (its step log's history)."""

    @property
    def dead_letters(self) -> EventLetterSink:
        """Where dead-lettered workflows are published."""

    @property
    def events(self) -> EventFactory:
        """Builds this process's events (ids derived, never random)."""

    @property
    def tools(self) -> ToolRegistry:
        """The tools recovery decisions may need by name."""

    @property
    def options(self) -> ResumeOptions:
        """How resumes wait and settle."""

    @property
    def record_limit(self) -> int:
        """The most bytes a recorded result may take in the step log (a larger one: its digest)."""

    def clock(self) -> datetime:
        """The wall clock (UTC) events are stamped with."""

    @property
    def timer(self) -> Timer:
        """The monotonic clock budgets and waits go by."""

    @property
    def hooks(self) -> HookPool | None:
        """Where settling runs recovery hooks (None: the process's shared pool)."""

    @property
    def fleet_budgets(self) -> FleetBudgets:
        """This process's reservations on its fleet's budget topic."""

    async def off_loop(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Run ``fn(*args)``, which waits on the log or a person, on the session's own
        threads (never asyncio's default pool, shared with the application's work)."""


class WorkflowHandle(Protocol):
    """What a helper may ask of a workflow: its state, its runner, and to record or re-read."""

    @property
    def ledger(self) -> Session:
        """The session the workflow records through."""

    @property
    def workflow_id(self) -> str:
        """The workflow's id (its Kafka key)."""

    @property
    def state(self) -> WorkflowState:
        """The workflow as the log tells it, folded."""

    @property
    def position(self) -> Position | None:
        """Where the handle's last appended event landed."""

    @property
    def runner(self) -> str:
        """The handle's runner identity (every claim, intent and outcome it writes names it)."""

    @property
    def epoch(self) -> int:
        """The attempt the handle claimed."""

    @property
    def attempt(self) -> int:
        """The run of the workflow this handle is."""

    @property
    def arrivals(self) -> dict[str, tuple[StepState, Arrival]]:
        """Each step as the handle's last read folded it, and when its events were appended
        on the session's clock (the broker's time: ``History.appended``)."""

    @property
    def lock(self) -> threading.RLock:
        """Held while the state is read or folded from several threads."""

    def record(self, event: ev.Event) -> Position:
        """Append an event durably, then fold it in."""

    def adopt(self, events: Iterable[ev.Event]) -> None:
        """Fold events someone else appended."""

    def read_claim(self, claim: ev.Event, position: Position) -> WorkflowState | None:
        """The log's fold of the workflow through one of its runner's claims (a ClaimCheck)."""

    def reload(self) -> None:
        """Read the workflow again and fold it afresh."""

    def tool(self, name: str) -> Tool:
        """A tool the workflow used or the session knows (raises when unknown)."""

    def known_tool(self, name: str) -> Tool | None:
        """A tool the workflow used or the session knows, or None."""

    def finish(
        self, status: WorkflowStatus = WorkflowStatus.COMPLETED, detail: str | None = None
    ) -> None:
        """Record that the workflow ended."""


__all__ = ["ResumeOptions", "Session", "WorkflowHandle"]

"""Pipelined outcomes: the step log as one workflow handle writes it, one outcome held back.

With ``ResumeOptions(pipeline_outcomes=True)`` a step's outcome is sent and folded at once
and its acknowledgement is waited for together with the handle's next append (sent after
it, so it lands before it) or before the handle next reads the log (:meth:`settle`).  The
wait overlaps the next step's intent (its A/B: docs/benchmarks.md, "Fast paths and their
A/B").  An outcome that is never
acknowledged leaves its step in doubt in the log and the handle unusable (docs/guarantees.md,
"Pipelined outcomes").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepledger.domain import events as ev
from stepledger.errors import DurabilityError

if TYPE_CHECKING:
    from stepledger.kafka import Position
    from stepledger.producer.session import Session


@dataclass(slots=True)
class HeldOutcome:
    """A pipelined outcome: sent, folded, its acknowledgement still to be waited for."""

    event: ev.Event
    wait: Callable[[], Position]
    """The log's wait for its acknowledgement: any thread, any number of times."""


class OutcomeLog:
    """A workflow handle's appends to the session's log, holding at most one outcome back."""

    __slots__ = ("_acknowledged", "_lock", "_session", "_workflow_id", "lost", "pending")

    def __init__(
        self,
        session: Session,
        workflow_id: str,
        lock: threading.RLock,
        acknowledged: Callable[[Position], None],
    ) -> None:
        self._session = session
        self._workflow_id = workflow_id
        self._lock = lock
        self._acknowledged = acknowledged
        """Told where a held outcome landed (under ``lock``), once it is no longer held."""
        self.pending: HeldOutcome | None = None
        self.lost: DurabilityError | None = None
        """Set once a held outcome was not acknowledged: the handle is no longer usable."""

    def ensure_usable(self) -> None:
        """Raise the lost outcome's error, if one was lost."""
        if self.lost is not None:
            raise self.lost

    def append(self, event: ev.Event) -> Position:
        """Append durably; a held outcome is waited for together with this event."""
        self.ensure_usable()
        log = self._session.log
        if self.pending is None:
            return log.append(event)
        # Sent first: the two waits overlap, and the outcome lands before this event.
        acknowledged = log.send(event)
        self.settle()
        return acknowledged()

    async def append_async(self, event: ev.Event) -> Position:
        """:meth:`append` on an event loop."""
        self.ensure_usable()
        pending = self.pending
        if pending is None:
            return await self._session.log.append_async(event)
        # The append produces before it first suspends, so this event lands after the
        # outcome; the outcome's report is served before this one's (one partition, in
        # order), so once this is acknowledged the outcome's wait returns at once.
        try:
            position = await self._session.log.append_async(event)
        except BaseException:
            await self._session.off_loop(self.settle_one, pending)  # may still be in flight
            raise
        self.settle_one(pending)
        return position

    def hold(self, event: ev.Event) -> HeldOutcome | None:
        """Send an outcome and hold its wait; return the one it replaces, still to settle.

        The wait is the log's thread-safe one, not an asyncio future: it is settled
        whichever thread or loop uses the handle next (a loop that stopped included).
        """
        self.ensure_usable()
        previous = self.pending
        self.pending = HeldOutcome(event, self._session.log.send(event))
        return previous

    def settle(self) -> None:
        """Wait until the held outcome is acknowledged (at once when there is none).

        Raises DurabilityError if it was not: the step stays in doubt in the log, to be
        resolved by its policy, and the handle refuses further use.
        """
        self.ensure_usable()
        pending = self.pending
        if pending is not None:
            self.settle_one(pending)

    async def asettle(self) -> None:
        """:meth:`settle` on an event loop (the wait goes to a thread)."""
        self.ensure_usable()
        pending = self.pending
        if pending is not None:
            await self._session.off_loop(self.settle_one, pending)

    def settle_one(self, held: HeldOutcome) -> None:
        """Wait for one held outcome; it stays held until its wait gave an answer."""
        try:
            position = held.wait()
        except DurabilityError as exc:
            step_id = held.event.step_id
            self.lost = DurabilityError(
                f"workflow {self._workflow_id!r}: the outcome of step {step_id!r} was not "
                f"acknowledged ({exc}); the step stays in doubt until its policy resolves "
                "it: open the workflow again",
                workflow_id=self._workflow_id,
                step_id=step_id,
            )
            raise self.lost from exc
        with self._lock:
            if self.pending is held:
                self.pending = None
                self._acknowledged(position)

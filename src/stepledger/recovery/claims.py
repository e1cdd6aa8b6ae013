"""Claims read back by the daemon's own consumer: the log, not the worker, says who decided.

A worker that is about to run a compensation appends its claim (``compensation_intended``)
and waits here; the daemon's loop, which folds the partition in log order, posts the step's
state as of the claim when it reads the claim back.  The worker goes on only if that fold
took the claim as the step's first decision.  If the claim is never read back in time (the
partition moved to another daemon, the daemon was paused past its session, the broker is
slow), the answer is "unknown" and nothing runs: the claim stays in the log, and whoever owns
the partition carries the compensation through after its deadline.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from stepledger.domain import events as ev
from stepledger.domain.state import WorkflowState
from stepledger.kafka import Position

_KEEP = 10_000


class ClaimBoard:
    """Posts from the consuming loop, waits from the resolving workers (thread-safe)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._posted: OrderedDict[str, WorkflowState | None] = OrderedDict()
        self._changed = threading.Condition()

    def post(self, claim_id: str, state: WorkflowState | None) -> None:
        """Record the fold as of a claim just read (None: its step is not tracked here)."""
        with self._changed:
            self._posted[claim_id] = state
            while len(self._posted) > _KEEP:
                self._posted.popitem(last=False)
            self._changed.notify_all()

    def wait(self, claim: ev.Event, position: Position) -> WorkflowState | None:
        """The workflow as the log has it through ``claim``, or None if not read in time."""
        with self._changed:
            self._changed.wait_for(lambda: claim.event_id in self._posted, self.timeout_s)
            return self._posted.pop(claim.event_id, None)

"""The order of one run's step calls: the position each step id takes in the workflow.

A step call is matched against the log by its step id and its position in the run
(:mod:`stepledger.domain.replay`): the first call of a step takes the next position, a
recorded step taken as the run's prefix (``Workflow.fast_forward``) keeps its recorded one.
"""

from __future__ import annotations

from collections.abc import Callable

from stepledger.domain.replay import steps_by_position
from stepledger.domain.state import WorkflowState


class RunOrder:
    """The positions this run gave its step calls, and the recorded ones it may still take."""

    __slots__ = ("_by_position", "_forwarded", "_next", "_taken")

    def __init__(self) -> None:
        self._taken: dict[str, int] = {}
        self._forwarded: dict[str, int] = {}
        """Recorded steps taken as this run's prefix (fast_forward), not yet asked for."""
        self._next = 0
        self._by_position: tuple[tuple[int, int], dict[int, list[str]]] | None = None

    def claim(
        self,
        state: WorkflowState,
        step_id: str,
        recorded_until: int,
        check: Callable[[int], None],
    ) -> tuple[bool, int]:
        """Give a step call its position; the first call of a step in this run is checked
        (``check(position)`` raises when the log recorded another call there)."""
        if step_id in self._taken:
            return False, self._taken[step_id]
        forwarded = self._forwarded.get(step_id)
        position = self._next if forwarded is None else forwarded
        # Only steps recorded before this run can disagree with it: a live run skips the
        # check.  A recorded step asked for out of order (fast_forward) is checked too: it
        # must be the recorded call, whatever position it is asked at.
        if position <= recorded_until or step_id in state.steps:
            check(position)
        self._taken[step_id] = position
        if forwarded is not None:
            del self._forwarded[step_id]
            return False, position  # as before: a failure asked for again is retried
        self._next += 1
        return True, position

    def steps_by_position(self, state: WorkflowState) -> dict[int, list[str]]:
        """Step ids by position, rebuilt only after the state folded another event."""
        version = (id(state), len(state.seen))
        if self._by_position is None or self._by_position[0] != version:
            self._by_position = (version, steps_by_position(state))
        return self._by_position[1]

    def fast_forward(self, state: WorkflowState, recorded_until: int) -> None:
        """Take the recorded steps as this run's prefix (see ``Workflow.fast_forward``)."""
        for step in state.ordered_steps():
            if step.sequence >= 0 and step.step_id not in self._taken:
                self._forwarded.setdefault(step.step_id, step.sequence)
        self._next = max(self._next, recorded_until + 1)

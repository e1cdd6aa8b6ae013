"""Operators' holds of recovery, as the tracker keeps them (``workflows pause --hold-recovery``).

A pause that holds recovery is an event of the workflow (``workflow_paused`` with
``hold_recovery``), and its unpause another; the tracker folds both into the steps of the
workflow it tracks, as it folds the workflow's claims, so each tracked step's own fold (and
its checkpoint entry) says whether recovery may settle it: a held step is not due at all
until the unpause, then it is due by its deadline as ever (decided at once when that has
passed).  Only the events that move a fold's hold are kept by a tracked step (a plain pause
changes nothing recovery does).  The workflows held now are remembered too, so a step
tracked after the pause (an intent that raced it) is folded with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepledger.domain import events as ev
from stepledger.domain.state import WorkflowState

#: The workflow events that hold recovery or lift the hold.
HOLDS = (ev.WorkflowPaused, ev.WorkflowUnpaused)


def moves_hold(state: WorkflowState, event: ev.Event) -> bool:
    """Whether folding ``event`` into ``state`` holds recovery or lifts its hold."""
    probe = state.copy()
    probe.apply(event)
    return probe.recovery_held_by != state.recovery_held_by


@dataclass(frozen=True, slots=True)
class _Held:
    partition: int
    pause: int
    event: ev.Event
    value: bytes


class HeldWorkflows:
    """Workflow -> the pause that holds its recovery now (lifted holds are forgotten)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def took(self, event: ev.Event, value: bytes, partition: int) -> None:
        """Keep a pause holding recovery; an unpause of it (or of a later pause) lets go."""
        body, wf = event.body, event.workflow_id
        if isinstance(body, ev.WorkflowPaused) and body.hold_recovery and wf not in self._held:
            self._held[wf] = _Held(partition, body.pause, event, value)
        elif isinstance(body, ev.WorkflowUnpaused):
            held = self._held.get(wf)
            if held is not None and body.pause >= held.pause:
                del self._held[wf]

    def took_all(self, events: Sequence[ev.Event], values: Sequence[bytes], partition: int) -> None:
        """The holds among a step's events (loaded, or read back), taken in log order."""
        for event, value in zip(events, values, strict=True):
            if isinstance(event.body, HOLDS):
                self.took(event, value, partition)

    def of(self, workflow_id: str) -> tuple[ev.Event, bytes] | None:
        """The pause holding the workflow's recovery, as event and value (None: none)."""
        held = self._held.get(workflow_id)
        return None if held is None else (held.event, held.value)

    def drop_partition(self, partition: int) -> None:
        """Forget the holds of a partition given up (its next owner reads them again)."""
        self._held = {wf: h for wf, h in self._held.items() if h.partition != partition}

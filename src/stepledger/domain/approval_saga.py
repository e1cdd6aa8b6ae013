"""The saga's state an approval request shows (pure): what happened, what a denial leaves.

A person approving a pivot must see what the workflow already did: the effects that
happened (or may have), which of them a compensation would undo if the pivot is denied,
which stay standing whatever is answered, and which the pivot commits (once it runs,
the saga no longer undoes them).
"""

from __future__ import annotations

import json
from typing import Any

from stepledger.domain.state import StepState, StepStatus, WorkflowState

_HAPPENED = frozenset({StepStatus.SUCCEEDED, StepStatus.INTENDED, StepStatus.ABANDONED})


def saga_state(state: WorkflowState, step_id: str) -> dict[str, Any]:
    """What an approval of ``step_id`` is asked against, as JSON-ready lists of steps."""
    happened = [
        s
        for s in state.ordered_steps()
        if s.step_id != step_id and s.effectful and s.status in _HAPPENED and s.effect is not None
    ]
    undoable = [s for s in happened if s.undoable and s.status is StepStatus.SUCCEEDED]
    return {
        "happened": [_brief(s) for s in happened],
        "undone_if_denied": [_brief(s) for s in undoable],
        "standing_if_denied": [_brief(s) for s in happened if s not in undoable],
        "committed_if_approved": [_brief(s) for s in undoable],
        "undone_before": [
            _brief(s) for s in state.ordered_steps() if s.status is StepStatus.COMPENSATED
        ],
    }


def saga_json(state: WorkflowState, step_id: str) -> str:
    """:func:`saga_state` as the compact JSON text a request records."""
    return json.dumps(saga_state(state, step_id), sort_keys=True, separators=(",", ":"))


def _brief(step: StepState) -> dict[str, Any]:
    return {
        "step_id": step.step_id,
        "tool": step.tool,
        "status": step.status.value,
        "undoable": step.undoable,
    }

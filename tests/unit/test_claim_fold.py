"""A claim's read-back folds only what follows the events read at open (it folded them twice).

Opening a running workflow reads it, folds it, records a claim and reads the log back
through the claim (the log's first decisions win).  The read-back begins with the events
read at open whenever nothing came between them: their fold is kept and only the rest is
folded onto it.  Whatever the read-back holds, the state must be the fold of all of it,
with the kept fold and without it (``KEEP_READ_FOLD``, the switch: every test runs both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.state import WorkflowState, replay
from stepledger.producer import Workflow
from stepledger.producer import workflow as workflow_module
from stepledger.producer.opening import claim
from tests.unit.resume_fakes import World

ARGS: dict[str, dict[str, Any]] = {
    "read": {"q": "flights"},
    "charge": {"amount": 120},
    "book": {"hotel": "Ritz"},
}


@pytest.fixture(autouse=True, params=[True, False], ids=["kept", "afresh"])
def keeps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The switch: a claim's read back keeps the fold of the read, or folds afresh."""
    monkeypatch.setattr(workflow_module, "KEEP_READ_FOLD", request.param)
    return bool(request.param)


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ids of the events every WorkflowState folds, in order."""
    seen: list[str] = []
    apply = WorkflowState.apply

    def counted(self: WorkflowState, event: ev.Event) -> object:
        seen.append(event.event_id)
        return apply(self, event)

    monkeypatch.setattr(WorkflowState, "apply", counted)
    yield seen


def unfinished(world: World) -> list[ev.Event]:
    """A workflow that ran three steps and stopped (its process died): its events."""
    ledger = world.ledger()
    services = {tool.name: tool for tool in ledger.tools}
    wf = ledger.workflow("wf", name="trip")
    for step_id, args in ARGS.items():
        wf.step(step_id, services[step_id], args)
    return world.log.workflow_events("wf")


def claimed(world: World, read: list[ev.Event]) -> Workflow:
    """A handle that read ``read`` at open, then claimed the next attempt."""
    handle = Workflow(world.ledger(), "wf", read)
    claim(handle, handle.state.attempt + 1, "test")
    return handle


def test_a_read_back_that_begins_with_the_read_folds_only_what_follows(
    folds: list[str], keeps: bool
) -> None:
    world = World()
    logged = unfinished(world)
    folds.clear()
    handle = claimed(world, logged)
    after = world.log.workflow_events("wf")
    claim_id = after[-1].event_id
    # The read, the claim into the state, then only the claim onto the kept fold (without
    # it, the whole read back).
    again = [claim_id] if keeps else [e.event_id for e in after]
    assert folds == [e.event_id for e in logged] + [claim_id, *again]
    assert handle.state == replay("wf", after)
    assert handle.state.runner == handle.runner


def test_events_another_runner_appended_after_the_read_are_folded_onto_it(
    folds: list[str], keeps: bool
) -> None:
    world = World()
    logged = unfinished(world)
    folds.clear()
    handle = claimed(world, logged[:3])  # read before the last steps landed
    after = world.log.workflow_events("wf")
    again = after[3:] if keeps else after
    assert folds == [e.event_id for e in logged[:3]] + [after[-1].event_id] + [
        e.event_id for e in again
    ]
    expected = replay("wf", after)
    assert handle.state == expected
    assert handle.state.pivots_happened == expected.pivots_happened
    assert handle.state.unresolved_undoable == expected.unresolved_undoable


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda logged: logged[:2] + logged[3:], id="one-missing"),
        pytest.param(lambda logged: [logged[0], logged[2], logged[1], *logged[3:]], id="reordered"),
    ],
)
def test_a_read_back_that_does_not_begin_with_the_read_is_folded_afresh(
    folds: list[str], read: Callable[[list[ev.Event]], list[ev.Event]]
) -> None:
    world = World()
    logged = unfinished(world)
    seen = read(logged)
    folds.clear()
    handle = claimed(world, seen)
    after = world.log.workflow_events("wf")
    assert folds == [e.event_id for e in seen] + [after[-1].event_id] + [e.event_id for e in after]
    assert handle.state == replay("wf", after)


def test_the_kept_fold_serves_one_read_back_and_is_not_changed_by_the_handle(
    folds: list[str],
) -> None:
    world = World()
    logged = unfinished(world)
    handle = claimed(world, logged)
    services = {tool.name: tool for tool in handle.ledger.tools}
    for step_id, args in ARGS.items():
        handle.step(step_id, services[step_id], args)  # replayed
    handle.step("email", services["email"], {"to": "a@example.test"})
    folds.clear()
    handle.reload()  # a later read back: folded afresh, the step above included
    after = world.log.workflow_events("wf")
    assert folds == [e.event_id for e in after]
    assert handle.state == replay("wf", after)
    assert "email" in handle.state.steps


def test_a_copy_folds_apart_from_its_original() -> None:
    world = World()
    logged = unfinished(world)
    state = replay("wf", logged[:3])
    twin = state.copy()
    for event in logged[3:]:
        twin.apply(event)
    whole = replay("wf", logged)
    assert state == replay("wf", logged[:3])
    assert twin == whole
    assert (twin.pivots_happened, twin.unresolved_undoable) == (
        whole.pivots_happened,
        whole.unresolved_undoable,
    )


@pytest.mark.parametrize(
    "moved",
    [
        # Folded events someone else appended: no longer the fold of what it read.
        pytest.param(lambda handle, logged: handle.adopt(logged[3:4]), id="adopted"),
        # Read back before its claim: the fold of the whole log, not of what it read.
        pytest.param(lambda handle, logged: handle.reload(), id="read-back-before-the-claim"),
    ],
)
def test_a_state_that_is_no_longer_the_fold_of_the_read_keeps_no_fold(
    folds: list[str], moved: Callable[[Workflow, list[ev.Event]], None]
) -> None:
    world = World()
    logged = unfinished(world)
    handle = Workflow(world.ledger(), "wf", logged[:3])
    moved(handle, logged)
    folds.clear()
    claim(handle, handle.state.attempt + 1, "test")
    after = world.log.workflow_events("wf")
    assert folds == [after[-1].event_id] + [e.event_id for e in after]
    assert handle.state == replay("wf", after)


def test_a_read_only_restart_keeps_no_fold_of_the_attempt_it_leaves() -> None:
    world = World()
    ledger = world.ledger()
    read = next(tool for tool in ledger.tools if tool.name == "read")
    wf = ledger.workflow("ro", name="q", read_only=True)
    for i in range(20):
        wf.step(f"r{i}", read, {"q": str(i)})
    again = world.ledger().workflow("ro", name="q", read_only=True)
    assert again.state.attempt == 2 and not again.state.steps
    # Nothing is read back after a restart: a kept fold would live as long as the handle.
    assert again._base is None and again._read is None

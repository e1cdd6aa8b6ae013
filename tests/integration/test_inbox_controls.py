"""A workflow's controls in the inbox: an operator of its fleet pauses, unpauses, cancels.

The inbox app over a real projection and an in-memory log (fleet-a: trip-old; fleet-b:
pay-new): an approver, or an operator of another fleet, gets a one-line 403 and the log
gains nothing; an operator of the workflow's fleet appends the event the CLI appends,
under the name the inbox authenticated.
"""

from __future__ import annotations

from pathlib import Path

from stepledger.domain import events as ev
from stepledger.inbox.auth import hash_token
from stepledger.inbox.roles import Grant, InboxRole
from stepledger.inbox.users import User
from tests.integration.test_inbox import form
from tests.integration.test_inbox_identity import ALICE_TOKEN, BOB_TOKEN, App

ALICE = User(hash_token(ALICE_TOKEN), Grant(frozenset({"fleet-b"}), InboxRole.APPROVER))
BOB = User(hash_token(BOB_TOKEN), Grant(frozenset({"fleet-b"}), InboxRole.OPERATOR))


def steering(app: App) -> list[ev.Event]:
    kinds = (ev.WorkflowPaused, ev.WorkflowUnpaused, ev.WorkflowCancelRequested)
    return [e for e in app.log.events if isinstance(e.body, kinds)]


def test_only_an_operator_of_the_workflows_fleet_may_pause_it(tmp_path: Path) -> None:
    app = App(tmp_path, token=None, users={"alice": ALICE, "bob": BOB})
    alice, bob = app.client(ALICE_TOKEN), app.client(BOB_TOKEN)
    hidden = form(bob.get("/escalations/esc-new").text)  # a page of bob's: its CSRF token
    pause = {**hidden, "command": "pause", "reason": "provider incident"}
    approver = alice.post("/workflows/pay-new/control", data=pause)
    assert approver.status_code == 403 and "that takes an operator" in approver.text
    other_fleet = bob.post("/workflows/trip-old/control", data=pause)
    assert other_fleet.status_code == 403 and "not of your fleets" in other_fleet.text
    assert bob.post("/workflows/pay-new/control", data={"command": "pause"}).status_code == 403
    assert bob.post("/workflows/pay-new/control", data={**pause, "command": "x"}).status_code == 400
    assert steering(app) == []
    done = bob.post("/workflows/pay-new/control", data=pause)
    assert (done.status_code, done.text) == (200, "pay-new: paused (pause 1)")
    again = bob.post("/workflows/pay-new/control", data=pause)
    assert again.text == "pay-new: already paused by bob"
    unpaused = bob.post("/workflows/pay-new/control", data={**hidden, "command": "unpause"})
    assert unpaused.text == "pay-new: unpaused (pause 1 by bob)"
    paused, lifted = steering(app)
    assert isinstance(paused.body, ev.WorkflowPaused) and isinstance(
        lifted.body, ev.WorkflowUnpaused
    )
    assert (paused.body.by, paused.body.auth, paused.fleet_id) == ("bob", "users_file", "fleet-b")
    assert paused.body.reason == "provider incident"


def test_the_case_page_shows_the_controls_to_an_operator_of_its_fleet_only(tmp_path: Path) -> None:
    app = App(tmp_path, token=None, users={"alice": ALICE, "bob": BOB})
    alice, bob = app.client(ALICE_TOKEN), app.client(BOB_TOKEN)
    assert 'id="control-form"' not in alice.get("/escalations/esc-new").text  # an approver
    page = bob.get("/escalations/esc-new").text
    assert '/workflows/pay-new/control" id="control-form"' in page
    done = bob.post("/workflows/pay-new/control", data={**form(page), "command": "pause"})
    assert (done.status_code, done.text) == (200, "pay-new: paused (pause 1)")
    assert [type(e.body) for e in steering(app)] == [ev.WorkflowPaused]


def test_only_an_operator_of_the_fleet_raises_its_model_budget_an_answer_in_the_log(
    tmp_path: Path,
) -> None:
    app = App(tmp_path, token=None, users={"alice": ALICE, "bob": BOB})
    alice, bob = app.client(ALICE_TOKEN), app.client(BOB_TOKEN)
    route = next(r for r in app.app.routes if getattr(r, "path", "") == "/budget/raise")
    budget_log = route.endpoint.__self__.log  # type: ignore[attr-defined]
    hidden = form(bob.get("/escalations/esc-new").text)
    raise_b = {**hidden, "fleet": "fleet-b", "tokens": "5000", "reason": "quarter end"}
    approver = alice.post("/budget/raise", data=raise_b)
    assert approver.status_code == 403 and "that takes an operator" in approver.text
    other_fleet = bob.post("/budget/raise", data={**raise_b, "fleet": "fleet-a"})
    assert other_fleet.status_code == 403 and "not of your fleets" in other_fleet.text
    assert bob.post("/budget/raise", data={"fleet": "fleet-b", "tokens": "1"}).status_code == 403
    assert bob.post("/budget/raise", data={**raise_b, "tokens": "x"}).status_code == 400
    assert bob.post("/budget/raise", data={**raise_b, "tokens": "0"}).status_code == 400
    assert budget_log.events == []
    done = bob.post("/budget/raise", data=raise_b)
    assert done.status_code == 200, done.text
    assert done.text.startswith("fleet fleet-b: raised by 5000 tokens")
    (raised,) = budget_log.events
    assert isinstance(raised.body, ev.BudgetRaised) and raised.fleet_id == "fleet-b"
    assert (raised.body.by, raised.body.auth, raised.body.note) == (
        "bob",
        "users_file",
        "quarter end",
    )

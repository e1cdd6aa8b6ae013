"""Restart a workflow from a step in the inbox: the plan shown, then confirmed (operators only).

First the app over a real projection and an in-memory log (the case page's form, another
fleet's operator, a plan that needs tools this inbox lacks), then ``stepledger inbox`` as a
real process on a real broker with a projector process and a users file (alice approves
fleet-b, bob operates it), over HTTP: the plan is shown and nothing is written; an
approver's confirmation, or one without the form's CSRF token, is a 403 and nothing is
written; a restart across a standing irreversible effect is a 409 naming that step; a
plan changed since it was shown is refused; bob's confirmation carries the restart through
the CLI's one path (the old workflow ends restarted, the new one replays the prefix).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import RunStatus, StepStatus, replay
from stepledger.history.kafka import KafkaHistory
from stepledger.inbox.auth import hash_token
from stepledger.inbox.roles import Grant, InboxRole
from stepledger.inbox.users import User, user_line
from stepledger.kafka import ensure_topics
from tests.e2e.recovery_helpers import append_events
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import snapshot_count, spawn_projector, wait_for
from tests.integration.test_inbox import everything, form
from tests.integration.test_inbox_fleets import _request
from tests.integration.test_inbox_identity import ALICE_TOKEN, BOB_TOKEN, App, _serve

ALICE = User(hash_token(ALICE_TOKEN), Grant(frozenset({"fleet-b"}), InboxRole.APPROVER))
BOB = User(hash_token(BOB_TOKEN), Grant(frozenset({"fleet-b"}), InboxRole.OPERATOR))
CARL_TOKEN = "carl-own-token-0000000000"
CARL = User(hash_token(CARL_TOKEN), Grant(frozenset({"fleet-a"}), InboxRole.OPERATOR))


def restartable(f: EventFactory) -> list[ev.Event]:
    """rs-ok: quote succeeded, charge failed (a tool bug): restartable from charge, no undo.
    rs-wire: hold_room, then send_wire happened: a restart from hold meets the wire.
    rs-hold: quote, hold_room succeeded: a restart from hold compensates the hold first."""
    events = []
    for wf in ("rs-ok", "rs-wire", "rs-hold"):
        events.append(
            f.workflow_started(wf, name="trip", attempt=1, read_only=False, max_attempts=3)
        )
    done = OutcomeStatus.SUCCEEDED
    for wf, step, tool, status in (
        ("rs-ok", "quote", h.QUOTE, done),
        ("rs-ok", "charge", h.LOOKUP, OutcomeStatus.FAILED),
        ("rs-wire", "hold", h.HOLD, done),
        ("rs-wire", "wire", h.WIRE, done),
        ("rs-hold", "quote", h.QUOTE, done),
        ("rs-hold", "hold", h.HOLD, done),
    ):
        sequence = sum(1 for e in events if e.workflow_id == wf and e.step_id) // 2
        events.append(f.intent(wf, step, tool, {"n": 1}, sequence=sequence))
        events.append(f.outcome(wf, step, attempt=1, status=status, result={"ok": step}))
    return events


def test_the_case_page_offers_the_restart_and_the_app_refuses_what_it_cannot_carry(
    tmp_path: Path,
) -> None:
    users = {"alice": ALICE, "bob": BOB, "carl": CARL}
    app = App(tmp_path, token=None, users=users)
    for event in restartable(h.factory("fleet-b")):
        app.log.append(event)
    alice, bob, carl = app.client(ALICE_TOKEN), app.client(BOB_TOKEN), app.client(CARL_TOKEN)
    written = len(app.log.events)
    assert 'id="restart-form"' not in alice.get("/escalations/esc-new").text
    page = bob.get("/escalations/esc-new").text
    assert '/workflows/pay-new/restart" id="restart-form"' in page
    hidden = form(page)
    other = carl.post("/workflows/rs-ok/restart", data={**hidden, "step": "charge"})
    assert other.status_code == 403 and "not of your fleets" in other.text
    plan = bob.post("/workflows/rs-hold/restart", data={**hidden, "step": "hold"})
    assert plan.status_code == 200 and 'id="undo-first"' in plan.text
    lacking = bob.post("/workflows/rs-hold/restart", data=form(plan.text))
    assert lacking.status_code == 409 and "with hold_room, which this inbox has no" in lacking.text
    # A new id naming a workflow the log holds (another fleet's): refused, nothing written.
    crafted = {**hidden, "step": "charge", "as": "trip-old"}
    taken = bob.post("/workflows/rs-ok/restart", data=crafted)
    assert taken.status_code == 409 and "'trip-old' is in the step log already" in taken.text
    unknown = bob.post("/workflows/rs-ok/restart", data={**hidden, "step": "nope"})
    assert unknown.status_code == 409 and "recorded no step 'nope'" in unknown.text
    assert len(app.log.events) == written  # nothing was written


@pytest.fixture
def served(
    bootstrap: str, tmp_path: Path, src_env: dict[str, str]
) -> Iterator[tuple[Settings, str]]:
    """fleet-b's workflows in a step log, projected and served by a real inbox process."""
    suffix = uuid.uuid4().hex[:10]
    settings = Settings(
        bootstrap=bootstrap,
        topic=f"restart-{suffix}",
        dlq_topic=f"restart-dlq-{suffix}",
        fleet_id="inbox",
        producer_id="inbox-restart-test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=2)
    events = [*everything(), *restartable(h.factory("fleet-b"))]
    append_events(settings, events)
    users = tmp_path / "users"
    lines = (user_line(name, u.hashed, u.grant) for name, u in (("alice", ALICE), ("bob", BOB)))
    users.write_text("".join(line + "\n" for line in lines))
    db = tmp_path / "ledger.duckdb"
    env = {k: v for k, v in src_env.items() if not k.startswith("STEPLEDGER_")}
    env.update(STEPLEDGER_BOOTSTRAP=bootstrap, STEPLEDGER_TOPIC=settings.topic)
    env.update(STEPLEDGER_DLQ_TOPIC=settings.dlq_topic, STEPLEDGER_FLEET_ID=settings.fleet_id)
    projector = spawn_projector(settings, db, env, "--snapshot-interval", "0.3")
    inbox: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: snapshot_count(db) >= len(events), 90, "the first snapshot")
        inbox, url = _serve(["--db", str(db), "--users", str(users)], env)
        yield settings, url.split("/?")[0]
    finally:
        for proc in (inbox, projector):
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def test_a_real_inbox_shows_the_restarts_plan_then_carries_the_confirmed_one(
    served: tuple[Settings, str],
) -> None:
    settings, base = served
    history = KafkaHistory(settings)
    try:
        status, page = _request(base + "/escalations/esc-new", BOB_TOKEN)
        assert status == 200 and 'id="restart-form"' in page
        route = base + "/workflows/rs-ok/restart"
        status, plan = _request(route, BOB_TOKEN, form(page, step="charge", reason="bug fixed"))
        assert status == 200, plan
        assert "replays the recorded outcomes of quote (no call)" in plan
        assert "compensates first in rs-ok: nothing" in plan and "Restart as rs-ok.r1" in plan
        assert ">bug fixed</textarea>" in plan
        assert not history.read("rs-ok.r1").events  # shown, nothing done
        confirm = form(plan, reason="bug fixed")  # the textarea keeps the reason given
        assert confirm["as"] == "rs-ok.r1" and confirm["step"] == "charge"
        # An approver of the fleet, a post without the form's token: 403, nothing written.
        status, refused = _request(route, ALICE_TOKEN, confirm)
        assert status == 403 and "that takes an operator" in refused, refused
        unsigned = {k: v for k, v in confirm.items() if k != "csrf"}
        assert _request(route, BOB_TOKEN, unsigned)[0] == 403
        # Across the standing irreversible wire: refused, naming it.
        wire = form(page, step="hold")
        status, refused = _request(base + "/workflows/rs-wire/restart", BOB_TOKEN, wire)
        assert status == 409, refused
        assert "wire (send_wire, happened, cannot be undone)" in refused
        # A confirmation of another plan than the log's now: refused.
        status, stale = _request(route, BOB_TOKEN, {**confirm, "confirm": "0" * 32})
        assert status == 409 and "changed since it was shown" in stale
        assert not history.read("rs-ok.r1").events
        assert replay("rs-ok", history.read("rs-ok").events).status is RunStatus.RUNNING
        # Bob confirms: carried through the CLI's restart path.
        status, done = _request(route, BOB_TOKEN, confirm)
        assert (status, done) == (200, "rs-ok: restarted as rs-ok.r1 from charge"), done
        old = replay("rs-ok", history.read("rs-ok").events)
        new = replay("rs-ok.r1", history.read("rs-ok.r1").events)
        assert old.status is RunStatus.RESTARTED and old.restarted_as == "rs-ok.r1"
        assert new.restarted_from == "rs-ok" and new.restart_step == "charge"
        assert new.fleet_id == "fleet-b"
        assert [(s.step_id, s.status) for s in new.ordered_steps()] == [
            ("quote", StepStatus.SUCCEEDED)
        ]
        (end,) = [
            e.body for e in history.read("rs-ok").events if e.body.type == "workflow_finished"
        ]
        assert isinstance(end, ev.WorkflowFinished)
        assert end.detail is not None and "bug fixed (by bob, users_file)" in end.detail
        status, again = _request(route, BOB_TOKEN, confirm)
        assert status == 409 and "already ended restarted" in again
    finally:
        history.close()

"""People bound to fleets: each person sees, counts and answers only their fleets' cases.

First the app over a real projection and an in-memory log (fleet-a: esc-old, esc-dead;
fleet-b: esc-new and the approval of trip-approve/wire), then ``stepledger inbox`` as a
real process on a real broker with a projector process, two fleets in one step log and a
users file binding alice to fleet-a and bob to fleet-b: every request a person could craft
for the other fleet's case is a one-line 403 and the log gains nothing.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.history.kafka import KafkaHistory
from stepledger.inbox.auth import hash_token
from stepledger.inbox.roles import Grant, InboxRole
from stepledger.inbox.users import User, user_line
from stepledger.kafka import ensure_topics
from tests.e2e.recovery_helpers import append_events
from tests.integration.projector_helpers import snapshot_count, spawn_projector, wait_for
from tests.integration.test_inbox import TOKEN, everything, form
from tests.integration.test_inbox_identity import ALICE_TOKEN, BOB_TOKEN, App, _serve

ALICE = User(hash_token(ALICE_TOKEN), Grant(frozenset({"fleet-a"}), InboxRole.APPROVER))
BOB = User(hash_token(BOB_TOKEN), Grant(frozenset({"fleet-b"}), InboxRole.OPERATOR))
NOT_YOURS = re.compile(r"^403: \w+: this case is not of your fleets \([\w-]+\)$")


def _rows(page: str) -> set[str]:
    return set(re.findall(r'data-case="([^"]+)"', page))


def test_each_person_lists_and_counts_only_their_fleets_cases(tmp_path: Path) -> None:
    app = App(tmp_path, token=None, users={"alice": ALICE, "bob": BOB})
    alice, bob = app.client(ALICE_TOKEN), app.client(BOB_TOKEN)
    mine = alice.get("/").text
    assert _rows(mine) == {"esc-old", "esc-dead"}
    assert re.search(r'id="total">2<', mine)
    assert "fleet-b" not in mine  # not even in the fleet filter's counts
    assert 'id="grant">approver of fleets fleet-a<' in mine
    theirs = bob.get("/queue/rows?kind=").text
    assert _rows(theirs) == {"esc-new", "trip-approve/wire"}
    # Asking for the other fleet by the filter shows nothing of it.
    assert _rows(alice.get("/?fleet=fleet-b").text) == set()
    assert _rows(alice.get("/queue/rows?fleet=fleet-b").text) == set()


def test_the_other_fleets_case_pages_and_crafted_answers_are_403_and_append_nothing(
    tmp_path: Path,
) -> None:
    app = App(tmp_path, token=TOKEN, users={"alice": ALICE, "bob": BOB})
    alice, bob = app.client(ALICE_TOKEN), app.client(BOB_TOKEN)
    own = alice.get("/escalations/esc-old")
    assert own.status_code == 200
    for path in ("/escalations/esc-new", "/approval?workflow=trip-approve&step=wire"):
        page = alice.get(path)
        assert page.status_code == 403 and NOT_YOURS.match(page.text), (path, page.text)
    assert bob.get("/escalations/esc-old").status_code == 403
    # Alice's own page carries a valid CSRF token: she crafts posts for fleet-b's cases.
    crafted = [
        ("/escalations/esc-new", form(own.text, answer="not_happened", by="x", note="n")),
        (
            "/approval",
            form(own.text, workflow="trip-approve", step="wire", answer="approve", note="n"),
        ),
        ("/escalations/esc-new", form(own.text, answer="maybe", note="")),  # bad and not hers
    ]
    for path, fields in crafted:
        refused = alice.post(path, data=fields)
        assert refused.status_code == 403 and NOT_YOURS.match(refused.text), refused.text
    assert app.answers() == []
    # Her own fleet's case she answers, under her authenticated name.
    done = alice.post("/escalations/esc-old", data=form(own.text, answer="not_happened", note="n"))
    assert done.status_code == 303
    (answer,) = app.answers()
    assert isinstance(answer.body, ev.EscalationResolved)
    assert (answer.body.by, answer.body.auth, answer.fleet_id) == ("alice", "users_file", "fleet-a")
    # The shared token (no person) keeps today's reach: every fleet, as an approver.
    shared = app.client(TOKEN)
    assert _rows(shared.get("/").text) == {"esc-old", "esc-new", "trip-approve/wire", "esc-dead"}


def test_behind_a_proxy_the_users_file_binds_the_named_people(tmp_path: Path) -> None:
    users = {"alice": ALICE, "pat": User(None, Grant(frozenset({"fleet-b"})))}
    app = App(tmp_path, token=TOKEN, proxy_header="X-Forwarded-User", users=users)

    def via_proxy(name: str) -> TestClient:
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-User": name}
        return TestClient(app.app, headers=headers, follow_redirects=False)

    pat = via_proxy("pat")
    assert _rows(pat.get("/").text) == {"esc-new", "trip-approve/wire"}
    assert pat.get("/escalations/esc-old").status_code == 403
    stranger = via_proxy("mallory").get("/")
    assert stranger.status_code == 401 and "does not list" in stranger.text
    # A proxy-only line has no token: its "-" opens nothing.
    assert TestClient(app.app).get("/", headers={"Authorization": "Bearer -"}).status_code == 401


def test_an_inbox_that_serves_one_fleet_shows_no_case_claiming_another(tmp_path: Path) -> None:
    # A fleet's inbox (its config pins fleet-a) reads fleet-a's log: a record there claiming
    # fleet-b (a misconfigured or hostile client of fleet-a) is nobody's case, even for a
    # person of every fleet or of fleet-b.
    everyone = User(hash_token(TOKEN + "-all"), Grant(None, InboxRole.OPERATOR))
    users = {"alice": ALICE, "bob": BOB, "root": everyone}
    app = App(tmp_path, token=None, users=users, serves=frozenset({"fleet-a"}))
    root, bob = app.client(TOKEN + "-all"), app.client(BOB_TOKEN)
    assert _rows(root.get("/").text) == {"esc-old", "esc-dead"}
    assert 'id="grant">operator of fleets fleet-a<' in root.get("/").text
    assert _rows(bob.get("/").text) == set()
    own = root.get("/escalations/esc-old").text
    for client in (root, bob):
        assert client.get("/escalations/esc-new").status_code == 403
        crafted = form(own, answer="not_happened", note="n")
        assert client.post("/escalations/esc-new", data=crafted).status_code == 403
    assert app.answers() == []


# The real processes: a broker, a projector publishing snapshots, `stepledger inbox`.


def _request(url: str, token: str, data: dict[str, str] | None = None) -> tuple[int, str]:
    body = None if data is None else urllib.parse.urlencode(data).encode()
    request = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {token}"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@pytest.fixture
def served(
    bootstrap: str, tmp_path: Path, src_env: dict[str, str]
) -> Iterator[tuple[Settings, str]]:
    """Two fleets' cases in one step log, projected and served by a real inbox process."""
    suffix = uuid.uuid4().hex[:10]
    settings = Settings(
        bootstrap=bootstrap,
        topic=f"fleets-{suffix}",
        dlq_topic=f"fleets-dlq-{suffix}",
        fleet_id="inbox",
        producer_id="inbox-fleets-test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=2)
    events = everything()
    assert {e.fleet_id for e in events} == {"fleet-a", "fleet-b"}
    append_events(settings, events)
    users = tmp_path / "users"
    users.write_text(
        "".join(
            user_line(name, user.hashed, user.grant) + "\n"
            for name, user in (("alice", ALICE), ("bob", BOB))
        )
    )
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


def test_a_real_inbox_serves_two_fleets_and_refuses_each_the_others_cases(
    served: tuple[Settings, str],
) -> None:
    settings, base = served
    status, alices = _request(base + "/", ALICE_TOKEN)
    assert status == 200 and _rows(alices) == {"esc-old", "esc-dead"}
    status, bobs = _request(base + "/", BOB_TOKEN)
    assert status == 200 and _rows(bobs) == {"esc-new", "trip-approve/wire"}
    assert "fleet-a" not in bobs and "fleet-b" not in alices
    status, page = _request(base + "/escalations/esc-new", ALICE_TOKEN)
    assert status == 403 and NOT_YOURS.match(page), page
    status, own = _request(base + "/escalations/esc-old", ALICE_TOKEN)
    assert status == 200
    crafted = form(own, answer="not_happened", note="crafted for fleet-b's case")
    status, refused = _request(base + "/escalations/esc-new", ALICE_TOKEN, crafted)
    assert status == 403 and NOT_YOURS.match(refused), refused
    approval = form(own, workflow="trip-approve", step="wire", answer="approve", note="n")
    status, refused = _request(base + "/approval", ALICE_TOKEN, approval)
    assert status == 403 and NOT_YOURS.match(refused), refused
    history = KafkaHistory(settings)
    kinds = (ev.EscalationResolved, ev.ApprovalDecided)
    for workflow in ("pay-new", "trip-approve"):
        assert not [e for e in history.read(workflow).events if isinstance(e.body, kinds)]
    # Bob answers his own fleet's approval: the log names him, authenticated by his token.
    status, page = _request(base + "/approval?workflow=trip-approve&step=wire", BOB_TOKEN)
    assert status == 200
    status, _ = _request(base + "/approval", BOB_TOKEN, form(page, answer="deny", note="no"))
    assert status == 303
    (decided,) = [e for e in history.read("trip-approve").events if isinstance(e.body, kinds)]
    assert isinstance(decided.body, ev.ApprovalDecided)
    assert (decided.body.by, decided.body.auth, decided.fleet_id) == (
        "bob",
        "users_file",
        "fleet-b",
    )

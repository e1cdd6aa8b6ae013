"""The inbox's approvers are who they say, and every bad input is a 4xx with a message.

The app over a real projection file and an in-memory log (as ``test_inbox`` does): a
users file, a trusted proxy header, the call an approval binds, and each bad filter or
answer the issue names; and, as processes, `stepledger inbox` taking its credentials
from a file or the environment, never from its command line.
"""

from __future__ import annotations

import re
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import replay
from stepledger.history.memory import InMemoryHistory
from stepledger.humanqueue.answers import Answerer
from stepledger.inbox.app import InboxConfig, create_app
from stepledger.inbox.auth import hash_token
from stepledger.inbox.users import User
from stepledger.log import InMemoryEventLog
from tests.integration import inbox_helpers as h
from tests.integration.test_inbox import HOSTS, PREFIX, ROOT, TOKEN, everything, form
from tests.unit.projector_harness import project, to_messages

ALICE_TOKEN = "alice-own-token-0123456789"
BOB_TOKEN = "bob-own-token-9876543210xx"


class App:
    """An inbox app over an in-memory log, with its configuration's identity options."""

    def __init__(self, tmp: Path, **options: object) -> None:
        self.log = InMemoryEventLog()
        for event in everything():
            self.log.append(event)
        self.db = tmp / "ledger.duckdb"
        project(self.db, to_messages(self.log.events), largest_batch=500)
        answerer = Answerer(
            self.log, EventFactory("inbox", "inbox-test"), InMemoryHistory(self.log)
        )
        config = InboxConfig(
            db_path=self.db,
            port=1,
            allowed_hosts=HOSTS,
            prefix=PREFIX,
            **options,  # type: ignore[arg-type]
        )
        self.app = create_app(config, answerer)

    def client(self, token: str) -> TestClient:
        client = TestClient(self.app, follow_redirects=False, base_url=f"{ROOT}{PREFIX}/")
        traded = client.get(f"{ROOT}/?token={token}")
        assert traded.status_code == 303, traded.text
        return client

    def answers(self) -> list[ev.Event]:
        kinds = (ev.EscalationResolved, ev.ApprovalDecided)
        return [e for e in self.log.events if isinstance(e.body, kinds)]


USERS = {"alice": User(hash_token(ALICE_TOKEN)), "bob": User(hash_token(BOB_TOKEN))}


def test_with_a_users_file_an_answer_records_the_authenticated_name(tmp_path: Path) -> None:
    app = App(tmp_path, token=None, users=USERS)
    anonymous = TestClient(app.app, follow_redirects=False)
    assert anonymous.get(f"/?token={TOKEN}").status_code == 401  # no shared token here
    assert anonymous.get("/?token=alice-own-token-000000000").status_code == 401
    alice = app.client(ALICE_TOKEN)
    page = alice.get("/escalations/esc-old").text
    assert 'id="as-name">alice<' in page and 'name="by"' not in page
    typed = form(page, answer="not_happened", by="the-ceo", note="no trace at the bank")
    assert alice.post("/escalations/esc-old", data=typed).status_code == 303
    (answer,) = app.answers()
    assert isinstance(answer.body, ev.EscalationResolved)
    assert (answer.body.by, answer.body.auth) == ("alice", "users_file")
    bob = TestClient(
        app.app, headers={"Authorization": f"Bearer {BOB_TOKEN}"}, follow_redirects=False
    )
    approval = bob.get("/approval?workflow=trip-approve&step=wire").text
    done = bob.post("/approval", data=form(approval, answer="deny", by="x", note="too much"))
    assert done.status_code == 303
    decided = app.answers()[-1].body
    assert isinstance(decided, ev.ApprovalDecided)
    assert (decided.by, decided.auth, decided.granted) == ("bob", "users_file", False)


def test_behind_a_trusted_proxy_the_header_names_the_user(tmp_path: Path) -> None:
    app = App(tmp_path, token=TOKEN, proxy_header="X-Forwarded-User")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    direct = TestClient(app.app)
    assert direct.get("/", headers=bearer).status_code == 401  # no name: not via the proxy
    assert direct.get("/", headers={"X-Forwarded-User": "mallory"}).status_code == 401
    forged = {"Authorization": "Bearer not-the-inbox-token-at-all", "X-Forwarded-User": "m"}
    assert direct.get("/", headers=forged).status_code == 401
    proxied = TestClient(
        app.app, headers={**bearer, "X-Forwarded-User": "carol"}, follow_redirects=False
    )
    page = proxied.get("/approval?workflow=trip-approve&step=wire").text
    assert 'id="as-name">carol<' in page
    done = proxied.post("/approval", data=form(page, answer="approve", by="dan", note="ok"))
    assert done.status_code == 303
    decided = app.answers()[-1].body
    assert isinstance(decided, ev.ApprovalDecided)
    assert (decided.by, decided.auth) == ("carol", "proxy_header")


def test_with_the_shared_token_the_typed_name_is_recorded_as_such(tmp_path: Path) -> None:
    app = App(tmp_path, token=TOKEN)
    client = app.client(TOKEN)
    page = client.get("/approval?workflow=trip-approve&step=wire").text
    done = client.post("/approval", data=form(page, answer="approve", by="erin", note="ok"))
    assert done.status_code == 303
    decided = app.answers()[-1].body
    assert isinstance(decided, ev.ApprovalDecided)
    assert (decided.by, decided.auth) == ("erin", "inbox_token")
    assert decided.arguments_digest == h.wire_call("trip-approve", h.WIRE_ARGS)[1]
    assert decided.request == 1


def test_a_page_showing_a_call_the_agent_replaced_cannot_approve_it(tmp_path: Path) -> None:
    app = App(tmp_path, token=TOKEN)
    client = app.client(TOKEN)
    shown_a = client.get("/approval?workflow=trip-approve&step=wire").text
    # The agent resumes and asks again with other arguments: request 2 voids request 1.
    f = h.factory("fleet-b")
    events = [e for e in app.log.events if e.workflow_id == "trip-approve"]
    call_b = {"amount": 9000, "to": "acct-B", "card": h.CARD}
    app.log.append(h.approval_request(f, "trip-approve", events, call_b, request=2))
    refused = client.post("/approval", data=form(shown_a, answer="approve", by="fay", note="ok"))
    assert refused.status_code == 409
    assert "asked again with other arguments" in refused.text
    assert "acct-B" in refused.text  # the page now shows the call it would approve
    assert app.answers() == []
    shown_b = refused.text
    done = client.post("/approval", data=form(shown_b, answer="approve", by="fay", note="ok"))
    assert done.status_code == 303
    state = replay("trip-approve", [e for e in app.log.events if e.workflow_id == "trip-approve"])
    gate = state.steps["wire"].approval
    assert gate is not None and gate.request == 2 and gate.granted is True
    assert gate.decided_digest == h.wire_call("trip-approve", call_b)[1]


@pytest.mark.parametrize(
    "query",
    [
        "age=99999999999d",
        "age=1e400d",
        "age=nan",
        "age=soon",
        "page=0",
        "page=-3",
        "page=x",
        "page=99999999999999999999",
        "kind=parcel",
        "order=sideways",
    ],
)
def test_every_bad_filter_is_a_400_with_a_message(tmp_path: Path, query: str) -> None:
    app = App(tmp_path, token=TOKEN)
    client = app.client(TOKEN)
    page = client.get(f"/?{query}")
    assert page.status_code == 400, (query, page.status_code)
    problem = re.search(r'<p class="notice" id="problem">([^<]+)</p>', page.text)
    assert problem is not None, query
    assert re.search(
        r"expected a duration|longer than|unknown page, kind or order", problem.group(1)
    )
    rows = client.get(f"/queue/rows?{query}")
    assert rows.status_code == 400 and rows.text.startswith("400: "), query


def test_every_bad_answer_is_a_4xx_with_a_message(tmp_path: Path) -> None:
    app = App(tmp_path, token=TOKEN)
    client = app.client(TOKEN)
    page = client.get("/approval?workflow=trip-approve&step=wire").text
    never_asked = form(page, workflow="trip-old", step="quote", answer="approve", by="g", note="n")
    response = client.post("/approval", data=never_asked)  # 503 before: "not recorded"
    assert response.status_code == 404 and "awaits no approval" in response.text
    unknown_workflow = form(page, workflow="nope", answer="approve", by="g", note="n")
    response = client.post("/approval", data=unknown_workflow)
    assert response.status_code == 404 and "awaits no approval" in response.text
    for fields, status, message in (
        ({"workflow": ""}, 400, "answered for a workflow and a step"),
        ({"step": "x" * 500}, 400, "answered for a workflow and a step"),
        ({"answer": "maybe"}, 400, "unknown answer"),
        ({"answer": "happened"}, 400, "answered with approve or deny"),
        ({"by": ""}, 400, "a name is required"),
        ({"note": ""}, 400, "a comment is required"),
        ({"digest": "0" * 64}, 409, "look again"),
    ):
        base = form(page, answer="approve", by="g", note="n")
        response = client.post("/approval", data={**base, **fields})
        assert response.status_code == status and message in response.text, (fields, response)
    assert app.answers() == []
    assert client.get("/approval").status_code == 404


def _serve(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepledger", "inbox", "--port", "0", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if "open http" in line:
                return proc, line.split("open ", 1)[1].strip()
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the inbox printed no URL (exit {proc.poll()})")


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_inbox_process_takes_its_credentials_from_a_file_never_the_command_line(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    env = {k: v for k, v in src_env.items() if not k.startswith("STEPLEDGER_")}
    db = str(tmp_path / "none.duckdb")
    shown = subprocess.run(
        [sys.executable, "-m", "stepledger", "inbox", "--db", db, "--token", TOKEN],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 2 and TOKEN not in shown.stdout
    assert [line for line in shown.stderr.splitlines() if line.startswith("Error")] == [
        "Error: --token on the command line is readable by every local user (the process "
        "list): set STEPLEDGER_INBOX_TOKEN or use --token-file"
    ]
    users = tmp_path / "users"
    added = subprocess.run(
        [sys.executable, "-m", "stepledger", "inbox-user", "ana", "--users", str(users)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    ana = added.stdout.strip().split(": ", 1)[1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc, url = _serve(["--db", db, "--users", str(users), "--token-file", str(token_file)], env)
    try:
        base = url.split("/?")[0]
        assert url.endswith(f"/?token={TOKEN}")
        assert _status(base + "/health", ana) == 200
        assert _status(base + "/health", TOKEN) == 200
        assert _status(base + "/health", "ana-but-not-her-token-123") == 401
    finally:
        proc.terminate()
        proc.wait(20)
    proc, url = _serve(["--db", db, "--users", str(users)], env)
    try:
        assert url.endswith("/?token=YOUR_TOKEN")  # only users open it: no shared token
        base = url.split("/?")[0]
        assert _status(base + "/health", ana) == 200
        assert _status(base + "/health", TOKEN) == 401
    finally:
        proc.terminate()
        proc.wait(20)

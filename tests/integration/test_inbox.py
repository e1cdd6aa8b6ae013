"""The inbox application without a browser: queue, case pages, answers, token and CSRF.

The queue reads a real projection file (built by the projector's engine); answers go to
an in-memory log here and to the real broker in the last test.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import Verdict
from stepledger.domain.factory import EventFactory
from stepledger.errors import AlreadyAnsweredError
from stepledger.history.kafka import KafkaHistory
from stepledger.history.memory import InMemoryHistory
from stepledger.humanqueue import escalations
from stepledger.humanqueue import queue as q
from stepledger.humanqueue.answers import Answerer
from stepledger.inbox.app import InboxConfig, create_app
from stepledger.inbox.auth import csrf_token
from stepledger.log import InMemoryEventLog, KafkaEventLog
from stepledger.projector.snapshot import snapshot_path
from tests.integration import inbox_helpers as h
from tests.unit.projector_harness import project, to_messages

TOKEN = "t0ken-for-the-inbox-tests"
HOSTS = ("testserver", "127.0.0.1")
PREFIX = "/s/inbox-test-prefix"
ROOT = "http://testserver"


class Inbox:
    """An inbox app over an in-memory log and a projection file rebuilt from that log."""

    def __init__(self, tmp: Path, events: list[ev.Event]) -> None:
        self.tmp = tmp
        self.log = InMemoryEventLog()
        for event in events:
            self.log.append(event)
        self.db = tmp / "ledger.duckdb"
        self.reproject()
        self.answerer = Answerer(
            self.log, EventFactory("inbox", "inbox-test"), InMemoryHistory(self.log)
        )
        config = InboxConfig(
            db_path=self.db, token=TOKEN, port=1, allowed_hosts=HOSTS, prefix=PREFIX
        )
        self.app = create_app(config, self.answerer)

    def reproject(self) -> None:
        """Rebuild the projection from the whole log (what the projector would publish)."""
        self.db.unlink(missing_ok=True)
        project(self.db, to_messages(self.log.events), largest_batch=500)

    def client(self) -> TestClient:
        """A client holding a session cookie, as a browser has after opening the URL.

        Its paths are relative to the inbox's prefix (where the session cookie is sent).
        """
        client = TestClient(self.app, follow_redirects=False, base_url=f"{ROOT}{PREFIX}/")
        assert client.get(f"{ROOT}/?token={TOKEN}").status_code == 303
        return client

    def answers(self) -> list[ev.Event]:
        """Every answer appended so far."""
        kinds = (ev.EscalationResolved, ev.ApprovalDecided)
        return [e for e in self.log.events if isinstance(e.body, kinds)]


def read_page(db: Path, wanted: q.QueueFilter, page_size: int = q.PAGE_SIZE) -> q.QueuePage:
    """One page from a source opened for it alone."""
    source = q.QueueSource(db, page_size)
    try:
        return source.page(wanted)
    finally:
        source.close()


def everything() -> list[ev.Event]:
    old, new = h.factory("fleet-a", hours_ago=3), h.factory("fleet-b", hours_ago=0.01)
    return [
        *h.escalated_wire(old, "trip-old", "esc-old"),
        *h.escalated_lookup(new, "pay-new", "esc-new"),
        *h.pending_approval(new, "trip-approve"),
        *h.dead_lettered(old, "trip-dead", "esc-dead"),
    ]


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    yield Inbox(tmp_path, everything())


def form(case_html: str, **fields: str) -> dict[str, str]:
    """The answer form's hidden fields from a case page, plus the given ones."""
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', case_html))
    return {**hidden, **fields}


def test_queue_lists_every_open_case_with_filters_counts_and_order(inbox: Inbox) -> None:
    page = read_page(inbox.db, q.QueueFilter())
    assert page.total == 4 and page.matching == 4
    assert page.by_kind == {"approval": 1, "escalation": 3}
    assert page.by_fleet == {"fleet-a": 2, "fleet-b": 2}
    assert [r.workflow_id for r in page.rows][-2:] in (
        ["trip-old", "trip-dead"],
        ["trip-dead", "trip-old"],
    )
    oldest = read_page(inbox.db, q.QueueFilter(order=q.Order.OLDEST))
    assert oldest.rows[0].workflow_id in ("trip-old", "trip-dead")
    assert [r.tool for r in read_page(inbox.db, q.QueueFilter(tool="send_wire")).rows] == [
        "send_wire",
        "send_wire",
    ]
    aged = read_page(inbox.db, q.QueueFilter(older_than=q.parse_age("1h")))
    assert {r.workflow_id for r in aged.rows} == {"trip-old", "trip-dead"}
    assert aged.total == 4 and aged.matching == 2
    only = read_page(inbox.db, q.QueueFilter(workflow="approve", kind=q.KindFilter.APPROVAL))
    assert [(r.kind, r.step_id) for r in only.rows] == [("approval", "wire")]
    paged = read_page(inbox.db, q.QueueFilter(page=2), page_size=3)
    assert (paged.page, paged.pages, len(paged.rows)) == (2, 2, 1)
    html = inbox.client().get("/?fleet=fleet-b").text
    assert "pay-new" in html and "trip-old" not in html
    assert re.search(r'<strong id="matching">2</strong> of <span id="total">4</span>', html)


def test_a_kept_connection_sees_the_next_published_snapshot(inbox: Inbox) -> None:
    # DuckDB shares one instance per path in a process: reopening the replaced snapshot
    # while the old connection lived returned the old file (caught by the browser test).
    snapshot = snapshot_path(inbox.db)
    shutil.copyfile(inbox.db, snapshot)
    source = q.QueueSource(inbox.db)
    try:
        assert source.page(q.QueueFilter()).total == 4
        for event in h.pending_approval(h.factory(), "trip-more"):
            inbox.log.append(event)
        inbox.reproject()
        partial = snapshot.with_name(snapshot.name + ".partial")
        shutil.copyfile(inbox.db, partial)
        os.replace(partial, snapshot)
        assert source.page(q.QueueFilter()).total == 5
        assert source.workflow_of("esc-old") == "trip-old"
    finally:
        source.close()


def test_every_request_needs_a_credential_and_the_browser_keeps_only_a_session(
    inbox: Inbox,
) -> None:
    anonymous = TestClient(inbox.app, follow_redirects=False)
    for path in (
        "/",
        "/queue/rows",
        "/escalations/esc-old",
        "/static/inbox.css",
        "/health",
        f"{PREFIX}/",
        f"{PREFIX}/escalations/esc-old",
        f"{PREFIX}/static/inbox.css",
    ):
        assert anonymous.get(path).status_code == 401, path
    assert anonymous.get("/?token=wrong-token-of-same-size").status_code == 401
    assert anonymous.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    traded = anonymous.get(f"/?token={TOKEN}&fleet=fleet-a")
    assert traded.status_code == 303 and traded.headers["location"] == f"{PREFIX}/?fleet=fleet-a"
    cookie = traded.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert f"Path={PREFIX}/" in cookie and "Max-Age=" in cookie
    session = cookie.split(";", 1)[0].split("=", 1)[1]
    assert TOKEN not in cookie and len(session) >= 40
    assert anonymous.get("/").status_code == 401  # outside its path the cookie opens nothing
    page = anonymous.get(f"{PREFIX}/")
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert f'href="{PREFIX}/static/inbox.css"' in page.text
    assert anonymous.get(f"{PREFIX}/static/inbox.css").status_code == 200
    # The token itself in the cookie opens nothing: only a session the server issued does.
    forged = TestClient(inbox.app, follow_redirects=False)
    forged.cookies.set("stepledger_inbox_1", TOKEN, path=f"{PREFIX}/")
    assert forged.get(f"{PREFIX}/").status_code == 401
    # Signing out revokes the session on the server, whoever still holds its id.
    copy = TestClient(inbox.app, follow_redirects=False)
    copy.cookies.set("stepledger_inbox_1", session, path=f"{PREFIX}/")
    assert copy.get(f"{PREFIX}/").status_code == 200
    out = anonymous.post(f"{PREFIX}/logout", data=form(page.text))
    assert out.status_code == 200 and "signed out" in out.text
    assert copy.get(f"{PREFIX}/").status_code == 401
    rebinding = TestClient(inbox.app, base_url="http://evil.example")
    assert rebinding.get(f"/?token={TOKEN}").status_code == 400


def test_case_page_shows_steps_intent_probes_and_policy_never_a_secret(inbox: Inbox) -> None:
    client = inbox.client()
    wire = client.get("/escalations/esc-old").text
    for shown in (
        "quote",
        "hold",
        "send_wire",
        "[redacted]",
        "PT50",
        "never decided automatically",
        "escalate: the tool can neither be looked up",
        "irreversible: once it happened",
        "unkeyed and irreversible",
        'id="answer-form"',
    ):
        assert shown in wire, shown
    lookup = client.get("/escalations/esc-new").text
    assert lookup.count("payments timed out") == 3 and "query attempts exhausted" in lookup
    approval = client.get("/approval?workflow=trip-approve&step=wire").text
    assert "a wire cannot be recalled" in approval and 'value="approve"' in approval
    call = re.search(r'<pre id="call-arguments">(.*?)</pre>', approval, re.S)
    assert call is not None
    assert "&#34;amount&#34;: 100" in call.group(1) and "acct-A" in call.group(1)
    assert "[redacted:hmac-sha256:" in call.group(1)
    _, digest = h.wire_call("trip-approve", h.WIRE_ARGS)
    assert f'<span class="mono" id="call-digest">{digest}</span>' in approval
    assert f'name="digest" value="{digest}"' in approval
    assert re.search(r'id="saga-undone">[^<]*<span class="mono">hold</span>', approval)
    assert "saga no longer undoes" in approval
    assert "Let it run again" in client.get("/escalations/esc-dead").text
    for page in (wire, lookup, approval):
        assert h.CARD not in page and h.CARD.replace(" ", "") not in page
    assert client.get("/escalations/esc-nope").status_code == 404


def test_an_answer_appends_the_clis_event_and_a_second_one_is_refused(inbox: Inbox) -> None:
    alice, bob = inbox.client(), inbox.client()
    page_alice = alice.get("/escalations/esc-old").text
    page_bob = bob.get("/escalations/esc-old").text
    # An irreversible wire cannot have "happened and was undone".
    assert 'id="answer-happened"' in page_alice and 'id="answer-compensated"' not in page_alice
    fields = {"answer": "happened", "result": '{"wire": "w-9"}', "by": "alice", "note": "bank"}
    done = alice.post("/escalations/esc-old", data=form(page_alice, **fields))
    assert done.status_code == 303, done.text
    (event,) = inbox.answers()
    # The very event `stepledger escalations resolve` appends for the same answer.
    cli_log = InMemoryEventLog()
    item = escalations.EscalationQueue().extend(everything()).get("esc-old")
    expected = escalations.answer(
        cli_log,
        EventFactory("x", "y"),
        item,
        Verdict.HAPPENED,
        by="alice",
        note="bank",
        result={"wire": "w-9"},
        auth="inbox_token",  # a typed name: the shared token proves none
    )
    assert event.event_id == expected.event_id and event.body == expected.body
    shown = alice.get(ROOT + done.headers["location"]).text
    assert "the one that counted" in shown and 'id="decided-by">alice<' in shown
    assert 'id="answer-form"' not in shown
    # What the answer causes and who acts next: the workflow waits for its agent.
    after = re.search(r'<p id="next">([^<]*)</p>', shown)
    assert after is not None and "Nothing runs by itself" in after.group(1)
    assert "goes on past it without calling send_wire again" in after.group(1)
    late = bob.post(
        "/escalations/esc-old",
        data=form(page_bob, answer="not_happened", by="bob", note="no trace"),
    )
    assert late.status_code == 409
    assert re.search(r"already answered by alice at \S+: happened", late.text)
    assert len(inbox.answers()) == 1
    inbox.reproject()
    assert "esc-old" not in alice.get("/").text


def test_a_post_without_csrf_or_from_another_origin_appends_nothing(inbox: Inbox) -> None:
    client = inbox.client()
    fields = {"answer": "not_happened", "by": "mallory", "note": "trust me"}
    assert client.post("/escalations/esc-old", data=fields).status_code == 403
    forged = {**fields, "csrf": csrf_token("another-token-entirely")}
    assert client.post("/escalations/esc-old", data=forged).status_code == 403
    page = client.get("/escalations/esc-old").text
    cross = client.post(
        "/escalations/esc-old",
        data=form(page, **fields),
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status_code == 403
    bearer = TestClient(inbox.app, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (
        bearer.post(
            "/approval",
            data={
                "workflow": "trip-approve",
                "step": "wire",
                "answer": "approve",
                "by": "m",
                "note": "n",
            },
        ).status_code
        == 403
    )
    assert inbox.answers() == []


def test_an_answer_needs_a_name_a_comment_and_json_for_its_result(inbox: Inbox) -> None:
    client = inbox.client()
    page = client.get("/escalations/esc-old").text
    for fields, problem in (
        ({"answer": "happened", "by": " ", "note": "x"}, "a name is required"),
        ({"answer": "happened", "by": "ann", "note": ""}, "a comment is required"),
        ({"answer": "happened", "by": "ann", "note": "x", "result": "{nope"}, "not valid JSON"),
        ({"answer": "not_happened", "by": "ann", "note": "x", "result": "1"}, "only with"),
        ({"answer": "approve", "by": "ann", "note": "x"}, "answered with a verdict"),
    ):
        refused = client.post("/escalations/esc-old", data=form(page, **fields))
        assert refused.status_code == 400 and problem in refused.text, (fields, refused.text)
    assert inbox.answers() == []


def test_an_approval_is_granted_from_its_page(inbox: Inbox) -> None:
    client = inbox.client()
    page = client.get("/approval?workflow=trip-approve&step=wire").text
    done = client.post("/approval", data=form(page, answer="approve", by="carol", note="ok"))
    assert done.status_code == 303
    (event,) = inbox.answers()
    assert isinstance(event.body, ev.ApprovalDecided)
    assert (event.body.granted, event.body.by, event.step_id) == (True, "carol", "wire")
    again = client.post("/approval", data=form(page, answer="deny", by="dan", note="no"))
    assert again.status_code == 409 and "already answered by carol" in again.text


class _RacingLog(InMemoryEventLog):
    """A log where someone else's answer lands just before ours (between check and append)."""

    def __init__(self, rival: ev.Event) -> None:
        super().__init__()
        self.rival: ev.Event | None = rival

    def append(self, event: ev.Event):  # type: ignore[no-untyped-def]
        if self.rival is not None and isinstance(event.body, ev.EscalationResolved):
            rival, self.rival = self.rival, None
            super().append(rival)
        return super().append(event)


def test_an_answer_that_lost_the_race_is_told_whose_counted() -> None:
    f = h.factory()
    rival = f.envelope(
        "trip",
        "wire",
        ev.EscalationResolved(
            escalation_id="esc", verdict=Verdict.NOT_HAPPENED, by="erin", note="first"
        ),
    )
    log = _RacingLog(rival)
    for event in h.escalated_wire(f, "trip", "esc"):
        log.append(event)
    answerer = Answerer(log, f, InMemoryHistory(log))
    receipt = answerer.answer_escalation("trip", "esc", Verdict.HAPPENED, by="finn", note="late")
    assert not receipt.counted
    assert receipt.decision is not None and receipt.decision.by == "erin"
    assert [d.by for d in receipt.case.late] == ["finn"]
    with pytest.raises(AlreadyAnsweredError) as refused:
        answerer.answer_escalation("trip", "esc", Verdict.HAPPENED, by="gus", note="later")
    assert refused.value.by == "erin"


def test_two_inboxes_answering_at_once_on_the_broker_yield_one_decision(
    settings: Settings,
) -> None:
    f = h.factory(settings.fleet_id)
    writer = KafkaEventLog(settings)
    try:
        for event in h.escalated_wire(f, "trip-race", "esc-race"):
            writer.append(event)
    finally:
        writer.close()
    inboxes = [
        Answerer(KafkaEventLog(settings), EventFactory("x", f"inbox-{n}"), KafkaHistory(settings))
        for n in range(2)
    ]
    start = threading.Barrier(2)
    results: list[object] = [None, None]

    def answer(n: int) -> None:
        start.wait(10)
        try:
            results[n] = inboxes[n].answer_escalation(
                "trip-race", "esc-race", Verdict.HAPPENED, by=f"person-{n}", note="checked"
            )
        except AlreadyAnsweredError as exc:
            results[n] = exc

    threads = [threading.Thread(target=answer, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for inbox in inboxes:
        inbox.log.close()
    counted = [r for r in results if getattr(r, "counted", False)]
    assert len(counted) == 1, results
    loser = next(r for r in results if r is not counted[0])
    winner = counted[0].event.body.by  # type: ignore[attr-defined]
    if isinstance(loser, AlreadyAnsweredError):
        assert loser.by == winner
    else:
        assert loser.decision.by == winner and not loser.counted  # type: ignore[attr-defined]
    events = KafkaHistory(settings).read("trip-race").events
    final = escalations.EscalationQueue().extend(events)
    assert final.open() == []

"""Two approvers of two fleets in Chromium: each sees only their fleet's cases, and an answer
crafted in the page for the other fleet's case is refused, with nothing written to the log.

A real broker, a projector process, ``stepledger inbox`` with a users file binding alice to
fleet-a and bob to fleet-b, and Debian's Chromium (headless, driven by Playwright; the
``browser`` fixture of ``test_inbox_browser`` fails when Chromium is missing, never skips).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.history.kafka import KafkaHistory
from stepledger.inbox.auth import hash_token
from stepledger.inbox.roles import Grant
from stepledger.inbox.users import user_line
from stepledger.kafka import ensure_topics
from tests.e2e.recovery_helpers import append_events
from tests.e2e.test_inbox_browser import (
    _context,
    _processes_env,
    _read_url,
    _src_env,
    _stop,
    browser,
)
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import snapshot_count, spawn_projector, wait_for

pytestmark = pytest.mark.e2e
__all__ = ["browser"]  # the Chromium fixture, shared with the other browser tests

ALICE = "alice-fleet-a-token-" + uuid.uuid4().hex[:8]
BOB = "bob-fleet-b-token-" + uuid.uuid4().hex[:8]
ANSWERS = (ev.EscalationResolved, ev.ApprovalDecided)


@dataclass
class Fleets:
    """Two fleets' cases in one step log, served by one inbox."""

    settings: Settings
    base: str
    """Scheme, host and port of the inbox."""

    def answers(self, workflow_id: str) -> list[ev.Event]:
        """The answers the log holds for a workflow (read from the topic)."""
        events = KafkaHistory(self.settings).read(workflow_id).events
        return [e for e in events if isinstance(e.body, ANSWERS)]


@pytest.fixture(scope="module")
def fleets(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleets]:
    suffix = uuid.uuid4().hex[:10]
    settings = Settings(
        bootstrap=bootstrap,
        topic=f"inbox-fleets-{suffix}",
        dlq_topic=f"inbox-fleets-dlq-{suffix}",
        fleet_id="inbox",
        producer_id="browser-fleets-test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=2)
    a, b = h.factory("fleet-a", hours_ago=1), h.factory("fleet-b", hours_ago=0.5)
    events = [
        *h.escalated_wire(a, "trip-a", "esc-a"),
        *h.pending_approval(a, "wire-a"),
        *h.escalated_wire(b, "trip-b", "esc-b"),
        *h.pending_approval(b, "wire-b"),
    ]
    append_events(settings, events)
    tmp = tmp_path_factory.mktemp("inbox-fleets")
    users = tmp / "users"
    users.write_text(
        user_line("alice", hash_token(ALICE), Grant(frozenset({"fleet-a"}))) + "\n"
        + user_line("bob", hash_token(BOB), Grant(frozenset({"fleet-b"}))) + "\n"
    )  # fmt: skip
    db = tmp / "ledger.duckdb"
    env = _processes_env(settings, _src_env())
    projector = spawn_projector(settings, db, env, "--snapshot-interval", "0.3")
    inbox: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: snapshot_count(db) >= len(events), 90, "the first snapshot")
        inbox = subprocess.Popen(
            [sys.executable, "-m", "stepledger", "inbox", "--db", str(db), "--port", "0",
             "--users", str(users)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        url = _read_url(inbox, 60)
        yield Fleets(settings, url.split("/?")[0])
    finally:
        if inbox is not None:
            _stop(inbox)
        _stop(projector)


def _signed_in(browser: Any, fleets: Fleets, token: str) -> tuple[Any, Any, str]:
    """A browser context signed in with a person's own token, its page and the pages' home."""
    context = _context(browser)
    page = context.new_page()
    page.goto(f"{fleets.base}/?token={token}")
    home = page.url.rstrip("/")
    assert "/s/" in home and token not in home  # traded for a session
    return context, page, home


def _cases(page: Any) -> set[str]:
    page.locator("tr[data-case]").first.wait_for()
    return {row.get_attribute("data-case") for row in page.locator("tr[data-case]").all()}


def test_two_approvers_each_see_only_their_fleets_cases(fleets: Fleets, browser: Any) -> None:
    for token, name, own, other in (
        (ALICE, "alice", {"esc-a", "wire-a/wire"}, "fleet-b"),
        (BOB, "bob", {"esc-b", "wire-b/wire"}, "fleet-a"),
    ):
        context, page, home = _signed_in(browser, fleets, token)
        assert _cases(page) == own
        assert page.locator("#total").inner_text() == "2"
        assert page.inner_text("#who").startswith(name)
        assert other not in page.content()  # not listed, not counted, not in the filter
        page.goto(home + f"/?fleet={other}")
        assert page.locator("tr[data-case]").count() == 0
        context.close()


def test_an_answer_crafted_for_the_other_fleets_case_is_refused_and_writes_nothing(
    fleets: Fleets, browser: Any
) -> None:
    context, page, home = _signed_in(browser, fleets, ALICE)
    opened = page.goto(home + "/escalations/esc-b")
    assert opened is not None and opened.status == 403
    assert page.inner_text("body").strip() == (
        "403: alice: this case is not of your fleets (fleet-a)"
    )
    # Her own case's form, pointed at bob's escalation: the CSRF token and cookie are hers.
    page.goto(home + "/escalations/esc-a")
    page.wait_for_selector("#answer-form")
    page.evaluate(
        "base => { document.querySelector('#answer-form').action = base + '/escalations/esc-b' }",
        home,
    )
    page.check("#answer-not_happened")
    page.fill("#note", "crafted for fleet-b's wire")
    with page.expect_navigation() as navigation:
        page.click("#submit")
    response = navigation.value
    assert response is not None and response.status == 403
    assert "not of your fleets" in page.inner_text("body")
    # The same form pointed at bob's approval, with the fields an approval names.
    page.goto(home + "/escalations/esc-a")
    page.wait_for_selector("#answer-form")
    # The submit navigates after evaluate returns: wait for that navigation, not the old page.
    with page.expect_navigation() as crafted:
        page.evaluate(
            """base => {
                const form = document.querySelector('#answer-form');
                form.action = base + '/approval';
                for (const [name, value] of [['workflow', 'wire-b'], ['step', 'wire'],
                                             ['answer', 'approve'], ['note', 'crafted']]) {
                    const input = document.createElement('input');
                    input.type = 'hidden'; input.name = name; input.value = value;
                    form.appendChild(input);
                }
                form.querySelectorAll('input[type=radio]').forEach(r => r.remove());
                HTMLFormElement.prototype.submit.call(form);  // the button is named submit
            }""",
            home,
        )
    refused = crafted.value
    assert refused is not None and refused.status == 403
    assert "not of your fleets" in page.inner_text("body")
    assert fleets.answers("trip-b") == [] and fleets.answers("wire-b") == []
    # Bob answers his own, and the log names him.
    bob, bobs_page, bobs_home = _signed_in(browser, fleets, BOB)
    bobs_page.goto(bobs_home + "/approval?workflow=wire-b&step=wire")
    bobs_page.check("#answer-deny")
    bobs_page.fill("#note", "not this week")
    bobs_page.click("#submit")
    bobs_page.wait_for_selector("#outcome")
    (answer,) = fleets.answers("wire-b")
    assert isinstance(answer.body, ev.ApprovalDecided)
    assert (answer.body.by, answer.body.auth, answer.fleet_id) == ("bob", "users_file", "fleet-b")
    bob.close()
    context.close()

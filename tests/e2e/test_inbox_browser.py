"""The inbox in a real browser: Debian's Chromium, headless, driven by Playwright.

A real broker, a real projector process publishing snapshots, ``stepledger inbox`` as a
real process, and Chromium loading its pages.  Chromium must be installed
(``.ci/install-browser``); without it these tests fail, they never skip.
"""

from __future__ import annotations

import http.client
import http.server
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.history.kafka import KafkaHistory
from stepledger.kafka import ensure_topics
from tests.e2e.recovery_helpers import append_events
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import snapshot_count, spawn_projector, wait_for

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "browser-test-token-" + uuid.uuid4().hex[:8]
DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Set to 1 to refresh the screenshots docs/operators.md shows.
SCREENSHOT_ENV = "STEPLEDGER_UPDATE_SCREENSHOTS"
TIMEOUT_MS = 30_000


@dataclass
class Stack:
    """What the tests run against."""

    settings: Settings
    url: str
    """The URL the inbox printed, token included."""
    base: str
    """Scheme, host and port of the inbox."""
    home: str
    """Where its pages live: ``base`` plus the random prefix the session cookie is scoped to."""

    def answers(self, workflow_id: str) -> list[ev.Event]:
        """The answers the log holds for a workflow (read from the topic, not the inbox)."""
        events = KafkaHistory(self.settings).read(workflow_id).events
        kinds = (ev.EscalationResolved, ev.ApprovalDecided)
        return [e for e in events if isinstance(e.body, kinds)]


def _processes_env(settings: Settings, src_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in src_env.items() if not k.startswith("STEPLEDGER_")}
    return {
        **env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
    }


def _src_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}


def _read_url(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if "open http" in line:
                return line.split("open ", 1)[1].strip()
        if proc.poll() is not None:
            break
    raise AssertionError(f"the inbox printed no URL (exit {proc.poll()})")


def _prefix(url: str) -> str:
    """The inbox's page prefix: where the token's first visit is redirected."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        connection.request("GET", f"{parts.path}?{parts.query}")
        response = connection.getresponse()
        assert response.status == 303, response.status
        location = response.getheader("location") or ""
    finally:
        connection.close()
    assert location.startswith("/s/") and location.endswith("/"), location
    return location.rstrip("/")


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def stack(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    suffix = uuid.uuid4().hex[:10]
    settings = Settings(
        bootstrap=bootstrap,
        topic=f"inbox-{suffix}",
        dlq_topic=f"inbox-dlq-{suffix}",
        fleet_id="travel",
        producer_id="browser-test",
    )
    ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=3)
    old, new = h.factory("travel", hours_ago=2), h.factory("payments", hours_ago=0.05)
    events = [
        *h.escalated_wire(old, "trip-lisbon", "esc-lisbon"),
        *h.escalated_wire(old, "trip-porto", "esc-porto"),
        *h.escalated_lookup(new, "order-7731", "esc-order"),
        *h.pending_approval(new, "trip-faro"),
    ]
    append_events(settings, events)
    tmp = tmp_path_factory.mktemp("inbox")
    db = tmp / "ledger.duckdb"
    env = _processes_env(settings, _src_env())
    projector = spawn_projector(settings, db, env, "--snapshot-interval", "0.3")
    inbox: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: snapshot_count(db) >= len(events), 90, "the first snapshot")
        inbox = subprocess.Popen(
            [sys.executable, "-m", "stepledger", "inbox", "--db", str(db), "--port", "0"],
            env={**env, "STEPLEDGER_INBOX_TOKEN": TOKEN},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        url = _read_url(inbox, 60)
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={TOKEN}")
        base = url.split("/?")[0]
        yield Stack(settings, url, base, base + _prefix(url))
    finally:
        if inbox is not None:
            _stop(inbox)
        _stop(projector)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: run .ci/install-browser "
            "(apt-get install -y chromium); the browser tests need it and do not skip"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


def _context(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    return context


def _shot(page: Any, name: str, tmp_path: Path, *, full: bool = False) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=full)
    if os.environ.get(SCREENSHOT_ENV) == "1":
        page.screenshot(path=str(DOCS / name), full_page=full)
    assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _answer(page: Any, option: str, by: str, note: str, result: str | None = None) -> None:
    page.check(f"#answer-{option}")
    if result is not None:
        page.fill("#result", result)
    page.fill("#by", by)
    page.fill("#note", note)


def test_answer_a_case_in_the_browser_and_watch_it_leave_the_queue(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    context = _context(browser)
    queue, case = context.new_page(), context.new_page()
    queue.goto(stack.url)
    assert queue.url == stack.home + "/"  # the token was traded for a session
    row = queue.locator('tr[data-case="esc-lisbon"]')
    row.wait_for()
    assert queue.locator("#total").inner_text() == "4"
    _shot(queue, "inbox-queue.png", tmp_path)
    case.goto(stack.home + "/")
    case.click('tr[data-case="esc-lisbon"] a')
    case.wait_for_selector("#answer-form")
    body = case.content()
    assert "[redacted]" in body and h.CARD not in body and h.CARD.replace(" ", "") not in body
    assert "escalate: the tool can neither be looked up" in body
    # An irreversible wire is offered no "happened and was undone".
    assert case.locator("#answer-compensated").count() == 0
    assert case.locator("#answer-not_happened").count() == 1
    _answer(case, "happened", "alice", "the bank statement shows wire w-1", '{"wire": "w-1"}')
    _shot(case, "inbox-case.png", tmp_path, full=True)
    case.click("#submit")
    case.wait_for_selector("#outcome")
    assert "the one that counted" in case.inner_text("#outcome")
    assert case.inner_text("#decided-by") == "alice"
    # The page says what the answer causes and who acts next.
    after = case.inner_text("#next")
    assert "Nothing runs by itself" in after and "ledger.workflow('trip-lisbon')" in after
    (answer,) = stack.answers("trip-lisbon")
    assert isinstance(answer.body, ev.EscalationResolved)
    assert (answer.body.by, answer.body.verdict.value, answer.body.result_json) == (
        "alice",
        "happened",
        '{"wire": "w-1"}',
    )
    # The queue page was never reloaded: it refreshes itself from the next snapshot.
    row.wait_for(state="detached", timeout=TIMEOUT_MS)
    assert queue.locator("#total").inner_text() == "3"
    context.close()


def test_a_second_browser_answering_the_same_case_is_refused(stack: Stack, browser: Any) -> None:
    first, second = _context(browser), _context(browser)
    pages = [ctx.new_page() for ctx in (first, second)]
    for page in pages:
        page.goto(stack.url)
        page.goto(stack.home + "/escalations/esc-porto")
        page.wait_for_selector("#answer-form")
    _answer(pages[0], "not_happened", "bob", "no wire in the bank's list")
    _answer(pages[1], "happened", "carol", "I think it went out")
    pages[0].click("#submit")
    pages[0].wait_for_selector("#outcome")
    pages[1].click("#submit")
    pages[1].wait_for_selector("#refusal")
    refusal = pages[1].inner_text("#refusal")
    assert "already answered by bob at" in refusal, refusal
    assert pages[1].inner_text("#decided-by") == "bob"
    (answer,) = stack.answers("trip-porto")
    assert answer.body.by == "bob"  # type: ignore[union-attr]
    first.close()
    second.close()


def test_an_approval_shows_the_exact_call_and_the_saga_and_binds_it(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    context = _context(browser)
    page = context.new_page()
    page.goto(stack.url + "&kind=approval")
    page.click('tr[data-case="trip-faro/wire"] a')
    page.wait_for_selector("#answer-form")
    body = page.content()
    assert "a wire cannot be recalled" in body
    call = page.inner_text("#call-arguments")
    assert '"amount": 100' in call and '"to": "acct-A"' in call
    assert "[redacted:hmac-sha256:" in call
    assert h.CARD not in body and h.CARD.replace(" ", "") not in body
    _, digest = h.wire_call("trip-faro", h.WIRE_ARGS)
    assert page.inner_text("#call-digest") == digest
    assert "hold" in page.inner_text("#saga-undone")
    assert "none" in page.inner_text("#saga-standing")
    _answer(page, "approve", "dana", "customer confirmed by phone")
    _shot(page, "inbox-approval.png", tmp_path, full=True)
    page.click("#submit")
    page.wait_for_selector("#outcome")
    (answer,) = stack.answers("trip-faro")
    assert isinstance(answer.body, ev.ApprovalDecided)
    assert (answer.body.granted, answer.body.by, answer.body.auth) == (True, "dana", "inbox_token")
    assert (answer.body.arguments_digest, answer.body.request) == (digest, 1)
    context.close()


#: What the other local server was sent, one dict of path and headers per request.
SEEN: list[dict[str, str]] = []


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Another local server the operator's browser visits: it records what it is sent."""

    def do_GET(self) -> None:
        SEEN.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>elsewhere</title><p>another local server</p>")

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_second_local_server_receives_nothing_that_opens_the_inbox(
    stack: Stack, browser: Any
) -> None:
    SEEN.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    other = f"http://127.0.0.1:{server.server_address[1]}"
    context = _context(browser)
    try:
        page = context.new_page()
        page.goto(stack.url)
        page.goto(stack.home + "/escalations/esc-order")
        page.wait_for_selector("#answer-form")
        for path in ("/", "/s/", "/escalations/esc-order", "/static/inbox.js"):
            page.goto(other + path)
        page.goto(other.replace("127.0.0.1", "localhost") + "/")
        assert len(SEEN) >= 4
    finally:
        server.shutdown()
        server.server_close()
    sent = [v for request in SEEN for v in request.values()]
    assert not any(TOKEN in value for value in sent), SEEN
    cookies = [request.get("cookie", "") for request in SEEN]
    # Whatever it received, nothing of it opens the inbox: not as a cookie, nor as a bearer.
    attacker = browser.new_context()
    try:
        values = {c.split("=", 1)[-1].strip() for line in cookies for c in line.split(";") if c}
        for value in values | {""}:
            for url in (stack.base + "/", stack.home + "/"):
                opened = attacker.request.get(url, headers={"authorization": f"Bearer {value}"})
                assert opened.status == 401, (url, value)
            jar = [
                {
                    "name": f"stepledger_inbox_{stack.base.rsplit(':', 1)[1]}",
                    "value": value or "x",
                    "url": stack.home + "/",
                }
            ]
            attacker.add_cookies(jar)
            assert attacker.request.get(stack.home + "/").status == 401
            attacker.clear_cookies()
    finally:
        attacker.close()
    # The operator's own session still opens it: the cookie was sent to the inbox only.
    assert page.goto(stack.home + "/") is not None
    assert page.locator("#total").inner_text() != ""
    context.close()


def test_a_request_without_the_token_is_refused(stack: Stack, browser: Any) -> None:
    context = _context(browser)
    page = context.new_page()
    for url in (
        stack.base + "/",
        stack.base + "/escalations/esc-order",
        stack.home + "/",
        stack.home + "/static/inbox.js",
    ):
        response = page.goto(url)
        assert response is not None and response.status == 401, url
        assert "needs its token" in page.content()
    response = page.goto(stack.base + "/?token=not-the-token-at-all")
    assert response is not None and response.status == 401
    context.close()


def test_a_form_post_without_csrf_is_refused(stack: Stack, browser: Any) -> None:
    context = _context(browser)
    page = context.new_page()
    page.goto(stack.url)
    page.goto(stack.home + "/escalations/esc-order")
    page.wait_for_selector("#answer-form")
    # The page's own form, minus its CSRF field: the browser sends the cookie, not the token.
    page.evaluate("document.querySelector('#answer-form input[name=csrf]').remove()")
    _answer(page, "not_happened", "mallory", "trust me")
    response = None
    with page.expect_navigation() as navigation:
        page.click("#submit")
    response = navigation.value
    assert response is not None and response.status == 403
    assert "CSRF" in page.content()
    posted = context.request.post(
        stack.home + "/escalations/esc-order",
        form={"answer": "not_happened", "by": "mallory", "note": "again"},
    )
    assert posted.status == 403
    assert stack.answers("order-7731") == []
    context.close()


def test_the_case_page_draws_the_workflow_timeline(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    context = _context(browser)
    page = context.new_page()
    page.goto(stack.url)
    page.goto(stack.home + "/escalations/esc-order")
    picture = page.locator("#timeline svg.timeline")
    picture.wait_for()
    box = picture.bounding_box()
    assert box is not None and box["width"] > 400 and box["height"] > 40
    steps = page.locator("#timeline g.tl-step")
    assert steps.count() >= 1
    # The step the case asks about waits for a person: hatched, and said so.
    asked = steps.filter(has_text="charge")
    assert asked.count() == 1 and "waits for a person" in (asked.text_content() or "")
    assert asked.locator("rect").get_attribute("fill") == "url(#tl-wait)"
    page.locator("#timeline").screenshot(path=str(tmp_path / "inbox-timeline.png"))
    if os.environ.get(SCREENSHOT_ENV) == "1":
        page.locator("#timeline").screenshot(path=str(DOCS / "inbox-timeline.png"))
    assert (tmp_path / "inbox-timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    context.close()

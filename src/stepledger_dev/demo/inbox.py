"""The demo's last act with ``--keep``: the inbox serves the open cases until Ctrl-C."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from stepledger.inbox.auth import new_token
from stepledger_dev.broker import LOOPBACK, free_port
from stepledger_dev.chaos.procs import STEPLEDGER
from stepledger_dev.demo.failure import DemoError
from stepledger_dev.stack import LocalStack

READY_S = 30.0


def start_inbox(stack: LocalStack) -> str:
    """Start ``stepledger inbox`` on the demo's projection; return its URL once it answers."""
    port, token = free_port(), new_token()
    stack.spawn(
        [*STEPLEDGER, "inbox", "--db", str(stack.db), "--host", LOOPBACK, "--port", str(port)],
        env=stack.child_env(STEPLEDGER_INBOX_TOKEN=token),
        stderr=stack.workdir / "inbox.log",
    )
    base = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + READY_S
    while not _healthy(base, token):
        if time.monotonic() > deadline:
            raise DemoError(f"the inbox did not answer within {READY_S:g}s (see inbox.log)")
        time.sleep(0.1)
    return f"{base}/?token={token}"


def _healthy(base: str, token: str) -> bool:
    request = urllib.request.Request(f"{base}/health", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_for_person(say: Callable[[str], None], url: str) -> None:
    """Keep everything running until Ctrl-C (or SIGTERM); answers are narrated as they land."""
    say(f"open the inbox to answer in your browser: {url}")
    say("the stack keeps running; answers appear below as they reach the log; Ctrl-C stops all")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        say("stopping: Ctrl-C")

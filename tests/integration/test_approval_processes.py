"""Approvals bound to the exact call, with real processes: agents and the CLI on the broker.

The attack from the issue: the agent asks approval for 100 to acct-A and exits; a person
approves; the resumed agent (its model re-planned) calls the same step with 9,000 to
acct-B.  Nothing is wired to acct-B: the call asks again, and an approval of the call the
person saw cannot approve the new one.  The same call approved runs once; an expired
approval asks again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from stepledger.cli._identity import os_user
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.history.kafka import KafkaHistory

CLI = [sys.executable, "-m", "stepledger"]
AGENT = [sys.executable, str(Path(__file__).parent / "agent_wire.py")]


class Bank:
    """Runs the agent and the CLI as processes; the wires file is what was really sent."""

    def __init__(self, settings: Settings, env: dict[str, str], tmp: Path) -> None:
        self.settings = settings
        self.wires = tmp / "wires.jsonl"
        self.env = {
            **env,
            "WIRES": str(self.wires),
            "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
            "STEPLEDGER_TOPIC": settings.topic,
            "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        }

    def agent(self, workflow: str, amount: int, to: str, *extra: str) -> int:
        args = [*AGENT, self.settings.bootstrap, self.settings.topic, workflow, str(amount), to]
        done = self.run([*args, *extra])
        assert done.returncode in (0, 3, 4), done.stderr
        return done.returncode

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([*CLI, *args])

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=90)

    def sent(self) -> list[dict[str, Any]]:
        if not self.wires.exists():
            return []
        return [json.loads(line) for line in self.wires.read_text().splitlines()]

    def shown(self, workflow: str) -> dict[str, Any]:
        done = self.cli("approvals", "show", workflow, "wire", "--json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def decisions(self, workflow: str) -> list[ev.ApprovalDecided]:
        events = KafkaHistory(self.settings).read(workflow).events
        return [e.body for e in events if isinstance(e.body, ev.ApprovalDecided)]


def test_approved_100_to_a_then_resumed_with_9000_to_b_wires_nothing_to_b(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    bank = Bank(settings, src_env, tmp_path)
    assert bank.agent("wf-attack", 100, "acct-A") == 3  # pending: the agent exits
    first = bank.shown("wf-attack")
    assert first["arguments"]["amount"] == 100 and first["arguments"]["to"] == "acct-A"
    assert first["arguments"]["pin"] != "1234"  # redacted, as the intent will record it
    assert [s["step_id"] for s in first["saga"]["undone_if_denied"]] == ["hold"]
    text = bank.cli("approvals", "show", "wf-attack", "wire")
    assert "acct-A" in text.stdout and "1234" not in text.stdout
    assert f"--digest {first['arguments_digest'][:16]}" in text.stdout
    approved = bank.cli("approve", "wf-attack", "wire", "--digest", first["arguments_digest"][:16])
    assert approved.returncode == 0, approved.stderr
    (decision,) = bank.decisions("wf-attack")
    assert (decision.by, decision.auth) == (os_user(), "os_user")
    assert decision.arguments_digest == first["arguments_digest"]

    assert bank.agent("wf-attack", 9000, "acct-B") == 3  # asked again, not run
    assert bank.sent() == []
    second = bank.shown("wf-attack")
    assert second["request"] == 2 and second["arguments"]["to"] == "acct-B"
    assert "differs from the one approved" in second["reason"]
    stale = bank.cli("approve", "wf-attack", "wire", "--digest", first["arguments_digest"][:16])
    assert stale.returncode == 1 and "asked again with other arguments" in stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1
    assert bank.agent("wf-attack", 9000, "acct-B") == 3
    assert bank.sent() == []

    # The model goes back to the call that was shown: it is asked for again, then runs once.
    assert bank.agent("wf-attack", 100, "acct-A") == 3
    third = bank.shown("wf-attack")
    assert third["request"] == 3 and third["arguments_digest"] == first["arguments_digest"]
    again = bank.cli("approve", "wf-attack", "wire", "--by", "alice", "--note", "checked")
    assert again.returncode == 0, again.stderr
    assert bank.decisions("wf-attack")[-1].auth == "declared"
    assert bank.agent("wf-attack", 100, "acct-A") == 0
    assert bank.agent("wf-attack", 100, "acct-A") == 0  # replayed, not called
    assert [(w["amount"], w["to"]) for w in bank.sent()] == [(100, "acct-A")]


def test_an_expired_approval_asks_again(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    bank = Bank(settings, src_env, tmp_path)
    assert bank.agent("wf-expiry", 100, "acct-A", "1") == 3
    assert bank.shown("wf-expiry")["valid_for_s"] == 1
    assert bank.cli("approve", "wf-expiry", "wire").returncode == 0
    decided = bank.shown("wf-expiry")["decision"]["at"]
    expired = datetime.fromisoformat(decided).astimezone(UTC) + timedelta(seconds=1.5)
    for _ in range(100):  # the condition is the clock passing the approval's validity
        if datetime.now(UTC) > expired:
            break
        time.sleep(0.05)
    assert bank.agent("wf-expiry", 100, "acct-A", "1") == 3
    assert bank.sent() == []
    assert "expired" in bank.shown("wf-expiry")["reason"]

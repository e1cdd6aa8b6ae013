"""A resumed workflow whose in-doubt step's effect is found settles it without waiting.

A real agent process SIGKILLs itself inside a keyed charge (policy ``query``); a new
ledger resumes the workflow.  Found (the service did it): the step is settled by the query
at once, well before the intent's deadline, and the charge is not made again.  Not found
(the process died before the effect): the resume still waits for the deadline (the call
might be in flight from a run that is only slow), then runs the step once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import stepledger as sl
from stepledger.codec import Codec
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.kafka.reader import read_topic

HERE = Path(__file__).parent


def kill_inside_charge(
    settings: sl.Settings, effects: Path, timeout_s: float, effect: bool, env: dict[str, str]
) -> None:
    """Run the dying agent: its intent is durable, no outcome follows."""
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "agent_effect_then_die.py"),
            settings.bootstrap,
            settings.topic,
            "wf-found",
            str(effects),
            str(timeout_s),
            "1" if effect else "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]


def charge_tool(effects: Path, timeout_s: float, calls: list[str]) -> sl.Tool:
    """The same charge as the agent's, with a query hook over the service's records."""

    def find(args: dict[str, Any], idempotency_key: str) -> sl.Found | sl.NotFound:
        keys = effects.read_text().split() if effects.exists() else []
        return sl.Found(args["amount"]) if idempotency_key in keys else sl.NotFound()

    @sl.tool(keyed=True, policy="query", query=find, timeout_s=timeout_s)
    def charge(amount: int, *, idempotency_key: str) -> int:
        calls.append(idempotency_key)
        with effects.open("a") as out:
            out.write(idempotency_key + "\n")
        return amount

    return charge


def resume(settings: sl.Settings, tool: sl.Tool) -> float:
    """Seconds for a new ledger to resume the workflow and get the charge's result."""
    began = time.perf_counter()
    with sl.Ledger(settings, tools=[tool]) as ledger:
        wf = ledger.workflow("wf-found")
        assert wf.step("charge", tool, amount=7) == 7
        wf.finish()
    return time.perf_counter() - began


def test_a_found_effect_settles_at_once_and_not_found_waits_for_the_deadline(
    make_settings: Any, tmp_path: Path, src_env: dict[str, str]
) -> None:
    found_settings, effects = make_settings(), tmp_path / "found"
    kill_inside_charge(found_settings, effects, 30.0, True, src_env)
    calls: list[str] = []
    elapsed = resume(found_settings, charge_tool(effects, 30.0, calls))
    assert elapsed < 10.0, f"a found effect still waited {elapsed:.1f}s (deadline 30 s)"
    assert calls == [] and len(effects.read_text().split()) == 1  # charged once
    events = [
        r.event
        for r in read_topic(found_settings, Codec(), idle_timeout=0.3)
        if r.event is not None
    ]
    decided = [e.body for e in events if isinstance(e.body, ev.StepOutcome)]
    assert [d.source for d in decided] == [Source.RECOVERY_QUERY]
    assert '"before_due":true' in (decided[0].evidence_json or "")

    missing_settings, nothing = make_settings(), tmp_path / "missing"
    kill_inside_charge(missing_settings, nothing, 2.0, False, src_env)
    calls = []
    resume(missing_settings, charge_tool(nothing, 2.0, calls))
    finished_at = datetime.now(UTC)
    events = [
        r.event
        for r in read_topic(missing_settings, Codec(), idle_timeout=0.3)
        if r.event is not None
    ]
    intent = next(e.body for e in events if isinstance(e.body, ev.StepIntended))
    assert intent.deadline is not None and finished_at >= intent.deadline
    assert len(calls) == 1 and nothing.read_text().split() == calls  # ran once, after it

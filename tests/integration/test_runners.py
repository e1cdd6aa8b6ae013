"""One live runner per workflow, on a real broker with services that count their own effects.

A runner frozen (SIGSTOP) between its intent's acknowledgement and the call wakes after
another runner settled the step and ran it again: it must not call.  Two live runners at
the same step: one effect, and the loser is told so in one line.  A result larger than a
record: one call across four runs, one clear error.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import EffectClass, Verdict
from stepledger.domain.state import StepStatus, replay
from stepledger.domain.tools import Tool
from stepledger.errors import ResultTypeError
from stepledger.history.kafka import KafkaHistory
from stepledger.producer import Ledger, ResumeOptions
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.clients import JsonObject, RunningService, _JsonClient, start_service
from stepledger_dev.examples.tools import BOOKINGS, EMAIL, PAYMENTS, make_registry
from tests.conftest import Factory, unique

TIMEOUT_S = 1.5
RUNNER = Path(__file__).with_name("agent_runner.py")
ARGS: dict[str, JsonObject] = {
    PAYMENTS: {"amount": 1200, "currency": "EUR", "customer": "cus_1"},
    BOOKINGS: {"hotel": "Hotel Lisboa", "nights": 2},
    EMAIL: {"to": "ana@example.com", "subject": "receipt", "body": "thanks"},
}
EFFECT = {PAYMENTS: "charge", BOOKINGS: "booking", EMAIL: "email"}
SERVICE = {PAYMENTS: "payments", BOOKINGS: "bookings", EMAIL: "email"}
URL_ENV = {
    "payments": "STEPLEDGER_PAYMENTS_URL",
    "bookings": "STEPLEDGER_BOOKINGS_URL",
    "email": "STEPLEDGER_EMAIL_URL",
}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll until the condition holds; fail the test past the timeout."""
    limit = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > limit:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningService]]:
    base = tmp_path_factory.mktemp("runners")
    running: dict[str, RunningService] = {}
    try:
        for kind in ("payments", "bookings", "email"):
            running[kind] = start_service(kind, base / f"{kind}.sqlite")
        yield running
    finally:
        for service in running.values():
            service.stop()


def effects(services: dict[str, RunningService], tool: str, key: str | None = None) -> int:
    return _JsonClient(services[SERVICE[tool]].url).effect_count(EFFECT[tool], key)


def tools_for(services: dict[str, RunningService], tool: str) -> ToolRegistry:
    """The example tool as the runners load it (the charge without its re-drive hook)."""
    urls = {kind: s.url for kind, s in services.items()}
    found = make_registry(urls["payments"], urls["bookings"], urls["email"], timeout_s=TIMEOUT_S)
    chosen = found.require(tool)
    if tool == PAYMENTS:
        chosen = chosen.model_copy(update={"redrive": None})
    return ToolRegistry([chosen])


def spawn(
    settings: Settings,
    services: dict[str, RunningService],
    src_env: dict[str, str],
    workflow: str,
    tool: str,
    *flags: str,
) -> subprocess.Popen[str]:
    env = {**src_env, "STEPLEDGER_TOOL_TIMEOUT_S": str(TIMEOUT_S), "RUNNER_NO_REDRIVE": "1"}
    env.update({URL_ENV[kind]: s.url for kind, s in services.items()})
    env["PYTHONPATH"] = f"{Path(__file__).resolve().parents[2]}{os.pathsep}{env['PYTHONPATH']}"
    command = [sys.executable, str(RUNNER), settings.bootstrap, settings.topic, workflow]
    command += ["step", tool, json.dumps(ARGS[tool]), *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)


def stopped(proc: subprocess.Popen[str]) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"runner {proc.pid} printed nothing within {timeout}s")
    return proc.stdout.readline().strip()


def last_answer(proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"runner printed no answer: {out!r}"
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def resume(settings: Settings, tools: ToolRegistry) -> Ledger:
    return Ledger(settings, tools=tools, options=ResumeOptions(grace_s=0.3, resolve_timeout_s=30))


def answer_not_happened(ledger: Ledger, workflow: str, escalation: str) -> None:
    body = ev.EscalationResolved(
        escalation_id=escalation, verdict=Verdict.NOT_HAPPENED, by="ann", note="no mail sent"
    )
    ledger.log.append(ledger.events.envelope(workflow, "step", body))


@pytest.mark.parametrize("tool", [PAYMENTS, BOOKINGS, EMAIL])
def test_a_frozen_runner_never_calls_after_another_runner_settled_its_step(
    make_settings: Factory,
    services: dict[str, RunningService],
    src_env: dict[str, str],
    tool: str,
) -> None:
    settings = make_settings()
    workflow = unique("wf-frozen")
    before = effects(services, tool)
    frozen = spawn(settings, services, src_env, workflow, tool, "--freeze")
    try:
        wait_for(lambda: stopped(frozen), 30, "the runner froze after its intent")
        tools = tools_for(services, tool)
        with resume(settings, tools) as ledger:
            wf = ledger.workflow(workflow)  # waits out the deadline, then settles the step
            step = wf.state.steps["step"]
            if tool == EMAIL:
                assert step.status is StepStatus.ABANDONED and step.escalation_id
                answer_not_happened(ledger, workflow, step.escalation_id)
                wf = ledger.workflow(workflow)
            assert wf.state.steps["step"].status is StepStatus.NOT_HAPPENED
            wf.step("step", tools.require(tool), ARGS[tool])
            if tool != EMAIL:  # the keyed tools: the retry kept the first attempt's key
                assert effects(services, tool, wf.state.steps["step"].idempotency_key) == 1
        os.kill(frozen.pid, signal.SIGCONT)
        answer = last_answer(frozen)
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(10)
    assert effects(services, tool) == before + 1
    assert answer.get("error") == "StepInDoubtError", answer
    assert "nothing was called" in answer["message"] and "\n" not in answer["message"]


def test_two_live_runners_at_one_step_make_one_effect_and_the_loser_is_told(
    make_settings: Factory,
    services: dict[str, RunningService],
    src_env: dict[str, str],
    tmp_path: Path,
) -> None:
    settings = make_settings()
    workflow = unique("wf-two")
    before = effects(services, EMAIL)
    go = tmp_path / "go"
    first = spawn(settings, services, src_env, workflow, EMAIL, "--hold", str(go))
    runners = [first]
    try:
        assert read_line(first, 30) == "ready"
        second = spawn(settings, services, src_env, workflow, EMAIL, "--hold", str(go))
        runners.append(second)
        assert read_line(second, 30) == "ready"
        go.touch()
        answers = [last_answer(r) for r in runners]
    finally:
        for r in runners:
            if r.poll() is None:
                r.kill()
                r.wait(10)
    assert effects(services, EMAIL) == before + 1
    losers = [a for a in answers if "error" in a]
    assert [a.get("error") for a in losers] == ["WorkflowTakenOverError"], answers
    assert "taken over" in losers[0]["message"] and "\n" not in losers[0]["message"]
    assert "result" in answers[1], answers  # the newer claim owns the workflow
    reader = KafkaHistory(settings)
    try:
        events = reader.read(workflow).events
    finally:
        reader.close()
    intents = [e for e in events if isinstance(e.body, ev.StepIntended)]
    assert len(intents) == 2 and len({e.event_id for e in intents}) == 2
    assert len({e.body.runner for e in intents if isinstance(e.body, ev.StepIntended)}) == 2
    state = replay(workflow, events)
    assert [a.kind for a in state.anomalies] == ["zombie_intent"]
    assert state.steps["step"].status is StepStatus.SUCCEEDED


def test_a_result_too_large_for_a_record_is_called_once_across_four_runs(
    make_settings: Factory,
) -> None:
    settings = make_settings()
    calls: list[str] = []

    def export(args: dict[str, Any], key: str) -> dict[str, str]:
        calls.append(key)
        return {"blob": "x" * 2_000_000}

    tool = Tool(name="export", keyed=True, timeout_s=1.0, run=export)
    errors: list[str] = []
    for _ in range(4):
        with resume(settings, ToolRegistry([tool])) as ledger:
            wf = ledger.workflow("wf-large")
            with pytest.raises(ResultTypeError) as caught:
                wf.step("export", tool, {"table": "orders"})
            errors.append(str(caught.value))
    assert len(calls) == 1
    assert len(set(errors)) == 1 and "'export'" in errors[0] and "larger than" in errors[0]
    assert "\n" not in errors[0]


def test_a_read_only_step_whose_runner_woke_past_its_deadline_is_read_not_left_intended(
    make_settings: Factory,
) -> None:
    # Recovery never decides a read-only step (its agent re-runs it), so a runner paused
    # between the intent and the call must still read: refusing left the intent open for
    # good (chaos seed 3: "step quote (catalog.quote) is still intended").
    settings = make_settings()
    calls: list[str] = []

    def quote(args: dict[str, Any], key: str) -> dict[str, int]:
        calls.append(key)
        return {"amount": 5000}

    tool = Tool(name="catalog.quote", effect=EffectClass.READ_ONLY, timeout_s=0.2, run=quote)
    with resume(settings, ToolRegistry([tool])) as ledger:
        wf = ledger.workflow("wf-late-read")
        woke: list[float] = []

        def paused(step_id: str) -> None:  # a GC pause or SIGSTOP past the whole budget
            until = time.monotonic() + 3 * tool.timeout_s
            for _ in range(1000):
                if time.monotonic() > until:
                    break
                time.sleep(0.01)
            woke.append(time.monotonic() - until)

        wf.after_intent = paused
        assert wf.step("quote", tool, {"trip": "t1"}) == {"amount": 5000}
        assert woke and woke[0] >= 0
    with resume(settings, ToolRegistry([tool])) as ledger:
        wf = ledger.workflow("wf-late-read")
        assert wf.state.steps["quote"].status is StepStatus.SUCCEEDED
        assert wf.step("quote", tool, {"trip": "t1"}) == {"amount": 5000}
    assert len(calls) == 1

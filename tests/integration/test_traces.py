"""One trace per workflow across an agent crash, a recovery decision and a resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.kafka.reader import read_topic
from stepledger.tracing import workflow_trace_id
from tests.integration.otel_process import WORKFLOW
from tests.integration.projector_helpers import wait_for

SCRIPT = [sys.executable, "-m", "tests.integration.otel_process"]


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trace_id(span: dict[str, Any]) -> int:
    return int(span["context"]["trace_id"], 16)


def _agent(mode: str, spans: Path, settings: Settings, env: dict[str, str]) -> int:
    done = subprocess.run(
        [*SCRIPT, mode, str(spans), settings.bootstrap, settings.topic],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, -9), done.stderr
    return done.returncode


def test_one_trace_per_workflow_across_a_crash_a_decision_and_a_resume(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    crashed, decided, resumed = (tmp_path / f"{n}.jsonl" for n in ("crash", "recover", "resume"))
    assert _agent("crash", crashed, settings, src_env) == -9
    daemon = subprocess.Popen(
        [
            *SCRIPT,
            "recover",
            str(decided),
            "--bootstrap",
            settings.bootstrap,
            "--topic",
            settings.topic,
            "--dlq-topic",
            settings.dlq_topic,
            "--tools",
            "tests.integration.otel_process:registry",
            "--no-entry-points",
            "--state-dir",
            str(tmp_path / "state"),
            "--group",
            f"recovery-{settings.topic}",
            "--grace",
            "0s",
            "--session-timeout",
            "2s",
        ],
        env=src_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: any(s["name"].startswith("stepledger.decision") for s in _spans(decided)),
            90,
            "the recovery decision's span",
        )
    finally:
        daemon.terminate()
        daemon.wait(30)
    assert _agent("resume", resumed, settings, src_env) == 0

    first, recovery, second = _spans(crashed), _spans(decided), _spans(resumed)
    everything = first + recovery + second
    assert {_trace_id(s) for s in everything} == {workflow_trace_id(WORKFLOW)}
    calls = [s for s in everything if s["name"].startswith("stepledger.call")]
    # fetch ran in the first process, notify in the resume; the killed call never ended,
    # and nothing the log had settled was called again.
    assert sorted(s["name"] for s in calls) == ["stepledger.call fetch", "stepledger.call notify"]
    steps = {(s["name"], s["attributes"].get("stepledger.replayed", False)) for s in second}
    assert ("stepledger.step fetch", True) in steps and ("stepledger.step book", True) in steps
    assert ("stepledger.step notify", False) in steps
    notify = next(s for s in second if s["name"] == "stepledger.step notify")
    assert [e["name"] for e in notify["events"]] == ["intent acknowledged", "outcome recorded"]
    attrs = notify["attributes"]
    assert attrs["stepledger.workflow_id"] == WORKFLOW and attrs["stepledger.step_id"] == "notify"
    assert attrs["stepledger.attempt"] == 1 and attrs["stepledger.idempotency_key"].startswith(
        "sl-"
    )
    assert attrs["stepledger.policy"] and attrs["stepledger.tool"] == "notify"
    assert any(s["name"] == "stepledger.workflow.open" for s in second)

    # The intent of the killed step carries the traceparent of its step span, and the
    # daemon's decision is a child of that span and linked to it.
    records = list(read_topic(settings, Codec(), idle_timeout=0.3))
    intent = next(
        r
        for r in records
        if r.event is not None
        and isinstance(r.event.body, ev.StepIntended)
        and r.event.step_id == "book"
    )
    traceparent = dict(intent.headers)["traceparent"]
    assert traceparent is not None
    _, trace_id, span_id, _ = traceparent.decode().split("-")
    assert int(trace_id, 16) == workflow_trace_id(WORKFLOW)
    decision = next(s for s in recovery if s["name"].startswith("stepledger.decision"))
    assert decision["parent_id"] == f"0x{span_id}"
    assert [link["context"]["span_id"] for link in decision["links"]] == [f"0x{span_id}"]
    assert decision["attributes"]["stepledger.step_id"] == "book"
    outcome_headers = [
        dict(r.headers).get("traceparent")
        for r in records
        if r.event is not None and isinstance(r.event.body, ev.StepOutcome)
    ]
    assert outcome_headers and all(outcome_headers)

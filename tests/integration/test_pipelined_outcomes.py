"""Pipelined outcomes on a real broker: order in the log, and a kill right after a step.

With ``ResumeOptions(pipeline_outcomes=True)`` a step returns once its outcome is sent;
it is acknowledged together with the next event.  On the broker: every workflow's log is
still started, (intent, outcome) per step in order, finished, from threads and asyncio
agents at once; and an agent SIGKILLed the moment a step returned leaves that step either
recorded or in doubt, never repeated: the resume finds the effect by its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import stepledger as sl
from stepledger.codec import Codec
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.errors import DurabilityError
from stepledger.kafka import ensure_topics
from stepledger.kafka.reader import read_topic
from stepledger.kafka.topics import step_log_config
from stepledger.producer.session import ResumeOptions
from stepledger_dev.broker import LocalBroker
from tests.integration.test_resume_found import charge_tool

HERE = Path(__file__).parent
PIPELINED = ResumeOptions(pipeline_outcomes=True)
STEPS = 6


@sl.tool(keyed=True, name="act")
def act(i: int, *, idempotency_key: str) -> int:
    return i


@sl.tool(keyed=True, name="act")
async def aact(i: int, *, idempotency_key: str) -> int:
    return i


def _kinds(settings: sl.Settings) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3):
        event = record.event
        assert event is not None
        name = event.type if event.step_id is None else f"{event.type} {event.step_id}"
        kinds.setdefault(event.workflow_id, []).append(name)
    return kinds


def test_threads_and_coroutines_with_pipelined_outcomes_write_each_workflow_in_order(
    settings: sl.Settings,
) -> None:
    def expected() -> list[str]:
        steps = [f"step_{k} s{i}" for i in range(STEPS) for k in ("intended", "outcome")]
        return ["workflow_started", *steps, "workflow_finished"]

    with sl.Ledger(settings, tools=[act], options=PIPELINED) as ledger:

        def agent(n: int) -> None:
            wf = ledger.start(f"thread-{n}")
            for i in range(STEPS):
                assert wf.step(f"s{i}", act, i=i) == i
            wf.finish()

        async def coroutines() -> None:
            async def one(n: int) -> None:
                wf = await ledger.astart(f"task-{n}")
                for i in range(STEPS):
                    assert await wf.astep(f"s{i}", aact, i=i) == i
                await wf.afinish()

            await asyncio.gather(*(one(n) for n in range(8)))

        threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        asyncio.run(coroutines())
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    kinds = _kinds(settings)
    assert sorted(kinds) == sorted(
        [f"thread-{n}" for n in range(8)] + [f"task-{n}" for n in range(8)]
    )
    for workflow, seen in kinds.items():
        assert seen == expected(), workflow


def test_an_agent_killed_the_moment_a_pipelined_step_returned_repeats_no_effect(
    make_settings: Any, tmp_path: Path, src_env: dict[str, str]
) -> None:
    branches: list[str] = []
    for run in range(3):
        settings, effects = make_settings(), tmp_path / f"effects-{run}"
        proc = subprocess.run(
            [
                sys.executable,
                str(HERE / "agent_pipelined_then_die.py"),
                settings.bootstrap,
                settings.topic,
                "wf-pipelined",
                str(effects),
                str(STEPS),
                "2",
            ],
            capture_output=True,
            text=True,
            env=src_env,
            timeout=60,
        )
        assert proc.returncode == -9, proc.stderr[-2000:]
        assert len(effects.read_text().split()) == 3  # s0, s1, s2 charged once each
        calls: list[str] = []
        charge = charge_tool(effects, 30.0, calls)
        with sl.Ledger(settings, tools=[charge]) as ledger:
            wf = ledger.workflow("wf-pipelined")
            for i in range(STEPS):
                assert wf.step(f"s{i}", charge, amount=i) == i
            wf.finish()
        keys = effects.read_text().split()
        assert len(keys) == STEPS == len(set(keys)), f"an effect repeated: {keys}"
        assert len(calls) == 3  # only s3..s5 were called by the resume
        events = [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]
        s2 = [
            e.body
            for e in events
            if e is not None and e.step_id == "s2" and isinstance(e.body, ev.StepOutcome)
        ]
        assert len(s2) == 1, s2  # one outcome: the agent's, or the resume's query
        branches.append("found by query" if s2[0].source is Source.RECOVERY_QUERY else "landed")
    print("s2's outcome per run:", branches)


@pytest.mark.own_tansu
def test_a_broker_frozen_under_a_pipelined_step_fails_the_next_call_and_nothing_repeats(
    tmp_path: Path,
) -> None:
    """The outcome never gets its acknowledgement: the next step raises and calls nothing;
    a resume after the broker is back settles every step once."""
    effects, calls = tmp_path / "effects", list[str]()
    with LocalBroker(log_path=tmp_path / "broker.log") as broker:
        settings = sl.Settings(
            bootstrap=broker.bootstrap,
            topic="events",
            dlq_topic="dlq",
            producer_id="test",
            durable_timeout_s=2.0,
        )
        configs = {settings.topic: step_log_config()}
        ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=1, configs=configs)
        charge = charge_tool(effects, 3.0, calls)

        def freeze_after(args: dict[str, Any], key: str) -> int:
            assert charge.run is not None and broker.process is not None
            out = charge.run(args, key)  # the service's effect, then the broker stops answering
            os.kill(broker.process.pid, signal.SIGSTOP)
            _stopped(broker.process.pid)
            return int(out)

        try:
            ledger = sl.Ledger(settings, tools=[charge], options=PIPELINED)
            wf = ledger.start("wf-frozen")
            assert wf.step("s0", charge, amount=0) == 0
            assert wf.step("s1", charge, amount=1, fn=freeze_after) == 1
            with pytest.raises(DurabilityError, match="outcome of step 's1'"):
                wf.step("s2", charge, amount=2)
            assert len(calls) == 2  # s2's tool was not called
            with pytest.raises(DurabilityError, match="open the workflow again"):
                wf.finish()
        finally:
            assert broker.process is not None
            os.kill(broker.process.pid, signal.SIGCONT)
        with contextlib.suppress(DurabilityError):  # the records it never got acknowledged
            ledger.close()
        calls.clear()
        with sl.Ledger(settings, tools=[charge]) as ledger:
            wf = ledger.workflow("wf-frozen")
            for i in range(4):
                assert wf.step(f"s{i}", charge, amount=i) == i
            wf.finish()
    keys = effects.read_text().split()
    assert len(keys) == 4 == len(set(keys)), f"an effect repeated: {keys}"
    assert len(calls) == 2  # the resume called s2 and s3 only: s1 was recorded or found


def _stopped(pid: int) -> None:
    """Return once every thread of the process is stopped (SIGSTOP is delivered late)."""
    tasks = Path(f"/proc/{pid}/task")
    for _ in range(2000):  # bounded: 2 s
        states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        if all(state in "tT" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"broker {pid} did not stop: {states}")

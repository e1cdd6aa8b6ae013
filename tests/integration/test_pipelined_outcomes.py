"""Pipelined outcomes on a real broker: order in the log, and a kill right after a step.

With ``ResumeOptions(pipeline_outcomes=True)`` a step returns once its outcome is sent;
it is acknowledged together with the next event.  On the broker: every workflow's log is
still started, (intent, outcome) per step in order, finished, from threads and asyncio
agents at once; and an agent SIGKILLed the moment a step returned leaves that step either
recorded or in doubt, never repeated: the resume finds the effect by its key.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import stepledger as sl
from stepledger.codec import Codec
from stepledger.domain import events as ev
from stepledger.domain.enums import Source
from stepledger.kafka.consumer import read_topic
from stepledger.producer.session import ResumeOptions

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


def _charge(effects: Path, calls: list[str]) -> sl.Tool:
    def find(args: dict[str, Any], idempotency_key: str) -> sl.Found | sl.NotFound:
        keys = effects.read_text().split() if effects.exists() else []
        return sl.Found(args["amount"]) if idempotency_key in keys else sl.NotFound()

    @sl.tool(keyed=True, policy="query", query=find, timeout_s=30.0)
    def charge(amount: int, *, idempotency_key: str) -> int:
        calls.append(idempotency_key)
        with effects.open("a") as out:
            out.write(idempotency_key + "\n")
        return amount

    return charge


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
        charge = _charge(effects, calls)
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

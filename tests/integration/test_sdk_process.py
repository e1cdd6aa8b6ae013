"""The SDK and CLI as real processes: SIGKILL after the intent, tail | append, user errors."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.tools import Tool
from stepledger.kafka.reader import read_topic
from stepledger.producer import Ledger
from stepledger_dev.broker import free_port

HERE = Path(__file__).parent
STEPLEDGER = [sys.executable, "-m", "stepledger"]
PAY = Tool(name="pay", effect="idempotent", keyed=True)


def cli(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STEPLEDGER, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def test_intent_is_durable_before_the_call(settings: Settings, src_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "agent_kill_after_intent.py"),
            settings.bootstrap,
            settings.topic,
        ],
        capture_output=True,
        text=True,
        env=src_env,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL
    key_seen_by_tool = proc.stdout.strip()
    events: list[Any] = [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]
    assert [e.type for e in events] == ["workflow_started", "step_intended"]
    assert events[1].body.idempotency_key == key_seen_by_tool


def record_sample(settings: Settings) -> None:
    with Ledger(settings) as ledger:
        for i in range(3):
            wf = ledger.start(f"wf-{i}", name="sample")
            wf.step("read", Tool(name="lookup", effect="read_only"), {"q": i}, fn=lambda a, k: [1])
            wf.step("pay", PAY, {"amount": i}, fn=lambda a, k: {"charge": k})


def test_tail_append_round_trips_exactly(make_settings: Any, src_env: dict[str, str]) -> None:
    source, copy = make_settings(), make_settings()
    record_sample(source)
    env = {**src_env, "STEPLEDGER_BOOTSTRAP": source.bootstrap}
    first = cli("tail", "--topic", source.topic, "--from-beginning", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.splitlines()) == 15
    appended = cli("append", "--topic", copy.topic, "-", env=env, stdin=first.stdout)
    assert appended.returncode == 0 and "appended 15 events" in appended.stdout
    second = cli("tail", "--topic", copy.topic, "--from-beginning", "--json", env=env)
    # Partitions interleave: compare the lines sorted.
    assert sorted(second.stdout.splitlines()) == sorted(first.stdout.splitlines())
    one = cli(
        "tail",
        "--topic",
        copy.topic,
        "--from-beginning",
        "--workflow",
        "wf-1",
        "--limit",
        "2",
        "--json",
        env=env,
    )
    assert [line.count('"wf-1"') for line in one.stdout.splitlines()] == [1, 1]


def test_invalid_lines_are_refused_whole(settings: Settings, src_env: dict[str, str]) -> None:
    record_sample(settings)
    env = {**src_env, "STEPLEDGER_BOOTSTRAP": settings.bootstrap}
    good = cli("tail", "--topic", settings.topic, "--from-beginning", "--json", env=env).stdout
    lines = good.splitlines()
    bad = "\n".join([lines[0], "{not json", lines[1], '{"event_id": "x"}', lines[2]])
    result = cli("append", "--topic", settings.topic, env=env, stdin=bad)
    assert result.returncode != 0
    assert "line 2:" in result.stderr and "line 4:" in result.stderr
    assert "Traceback" not in result.stderr
    after = cli("tail", "--topic", settings.topic, "--from-beginning", "--json", env=env).stdout
    assert len(after.splitlines()) == len(lines), "nothing from the bad input was produced"


def test_user_errors_are_one_line_and_non_zero(settings: Settings, src_env: dict[str, str]) -> None:
    env = {**src_env, "STEPLEDGER_BOOTSTRAP": settings.bootstrap}
    cases = [
        (["tail", "--topic", "no-such-topic", "--from-beginning"], "does not exist"),
        (["tail", "--bootstrap", f"127.0.0.1:{free_port()}", "--from-beginning"], "cannot reach"),
        (["tail", "--bootstrap", "nonsense"], "HOST:PORT"),
        (["tail", "--no-such-flag"], "No such option"),
        (["append", "/no/such/file.jsonl"], "No such file"),
    ]
    for args, message in cases:
        result = cli(*args, env=env)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_async_agents_record_concurrently(settings: Settings) -> None:
    async def agent(ledger: Ledger, i: int) -> Any:
        wf = await ledger.astart(f"wf-async-{i}")

        async def call(args: dict[str, Any], key: str) -> int:
            await asyncio.sleep(0)
            return i

        return await wf.astep("s", PAY, {"i": i}, fn=call)

    async def main() -> list[Any]:
        with Ledger(settings) as ledger:
            return await asyncio.gather(*(agent(ledger, i) for i in range(8)))

    assert asyncio.run(main()) == list(range(8))
    events: list[Any] = [r.event for r in read_topic(settings, Codec(), idle_timeout=0.3)]
    outcomes = [e.body for e in events if e.type == "step_outcome"]
    assert len(outcomes) == 8 and all(o.status is OutcomeStatus.SUCCEEDED for o in outcomes)


def test_registry_framing_end_to_end(make_settings: Any) -> None:
    settings = make_settings(schema_registry_url="mock://stepledger-e2e")
    with Ledger(settings) as ledger:
        ledger.start("wf-reg").step("s", PAY, {}, fn=lambda a, k: 1)
    records = list(read_topic(settings, Codec(), idle_timeout=0.3))
    assert len(records) == 3
    assert all(r.value is not None and r.value[:1] == b"\x00" for r in records)

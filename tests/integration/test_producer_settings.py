"""A user's librdkafka settings reach the durable producer, or are refused in one line.

Before: the SDK's durable settings (``linger.ms=0``, ``acks=all``, ...) were applied after
the user's ``-X`` settings, so ``-X linger.ms=5`` was silently dropped and ``-X acks=1``
silently ignored.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import stepledger as sl
from stepledger.codec.jsonlines import render_event
from stepledger.config import Settings
from stepledger.errors import ConfigError
from tests.conftest import Factory
from tests.unit.factories import factory

LINGER_MS = 400


@sl.tool(keyed=True)
def noop(i: int, *, idempotency_key: str) -> int:
    """A tool whose cost is nothing."""
    return i


def test_a_user_linger_is_honoured_by_the_durable_producer(make_settings: Factory) -> None:
    settings = make_settings(kafka={"linger.ms": str(LINGER_MS)})
    with sl.Ledger(settings, tools=[noop]) as ledger:
        wf = ledger.start("linger")  # the first write also waits for the producer id
        began = time.perf_counter()
        wf.step("s0", noop, i=0)
        elapsed = time.perf_counter() - began
    # Two durable writes, each lingering before it is sent: a step of 2 ms on main.
    assert elapsed >= 2 * LINGER_MS / 1000 * 0.9, elapsed


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("acks", "1"),
        ("enable.idempotence", "false"),
        ("max.in.flight.requests.per.connection", "10"),
        ("message.timeout.ms", "1000"),
    ],
)
def test_a_setting_that_weakens_durable_writes_is_refused(
    settings: Settings, key: str, value: str
) -> None:
    unsafe = settings.model_copy(update={"kafka": {key: value}})
    with pytest.raises(ConfigError, match=f"-X {key}={value} is refused"):
        sl.Ledger(unsafe)


def test_the_cli_refuses_an_unsafe_setting_in_one_line(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    f = factory()
    started = f.workflow_started("w", name="", attempt=1, read_only=False, max_attempts=2)
    source = tmp_path / "in.jsonl"
    source.write_text(render_event(started) + "\n")
    command = [sys.executable, "-m", "stepledger", "append", "--bootstrap", settings.bootstrap]
    command += ["--topic", settings.topic, "-X", "acks=1", str(source)]
    result = subprocess.run(command, capture_output=True, text=True, env=src_env, timeout=60)
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "-X acks=1 is refused" in lines[0], result.stderr

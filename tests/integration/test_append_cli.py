"""``stepledger append`` is all-or-nothing: every line is validated and encoded first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepledger.codec import Codec
from stepledger.codec.jsonlines import render_event
from stepledger.config import Settings
from stepledger.kafka.reader import read_topic
from tests.unit.factories import factory
from tests.unit.projector_logs import TOOLS


def test_a_line_that_fails_at_encode_or_size_appends_nothing(
    settings: Settings, src_env: dict[str, str], tmp_path: Path
) -> None:
    f = factory()
    good = render_event(
        f.workflow_started("w", name="", attempt=1, read_only=False, max_attempts=2)
    )
    intent = json.loads(render_event(f.intent("w", "s", TOOLS[0], {}, sequence=0)))
    huge = {**intent, "body": {**intent["body"], "arguments_json": "x" * 10_000_000}}
    wide = {**intent, "event_id": "e-wide", "body": {**intent["body"], "attempt": 2**63}}
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"\n".join(
            [
                good.encode(),
                json.dumps(wide).encode(),
                json.dumps(huge).encode(),
                b'{"event_id": "\xff\xfe"}',
                good.encode(),
            ]
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepledger",
            "append",
            "--bootstrap",
            settings.bootstrap,
            "--topic",
            settings.topic,
            str(source),
        ],
        capture_output=True,
        text=True,
        env=src_env,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["line 2", "line 3", "line 4"], lines
    assert "attempt" in lines[0] and "limit" in lines[1] and "UTF-8" in lines[2]
    assert "Traceback" not in result.stderr and len(lines) == 4
    assert list(read_topic(settings, Codec(), idle_timeout=0.3)) == []

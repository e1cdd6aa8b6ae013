"""No secret leaves the process: the topic's raw bytes, dead letters, DuckDB, CLI and logs.

One workflow against the real broker: a call that fails echoing its arguments (every
secret, also nested), a call whose result echoes them, a call left in doubt whose error
echoes a nested secret; a resuming agent then settles it (its query hook gets the
redacted arguments and fails; recovery gives up: escalation and dead letter).  Then the
raw record values of both topics, every DuckDB file and every cell the projector wrote,
``workflows show`` / ``escalations show`` and the captured log lines are searched for every
clear secret in every grouping.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from stepledger.cli import cli
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.context import render
from stepledger.domain.secrets import MARKER
from stepledger.domain.tools import NotFound
from stepledger.errors import StepInDoubtError
from stepledger.kafka.reader import Record, read_topic
from stepledger.producer import Ledger, ResumeOptions
from stepledger.projector.schema import TABLES
from tests.integration.projector_helpers import projecting
from tests.unit.secret_leaks import ARGS, CARD, NOTE, leaks, secret_tool

TOOL_TIMEOUT_S = 2.0
WF = "secret-trip"


def records(settings: Settings, topic: str) -> list[Record]:
    return list(read_topic(settings, Codec(), topic=topic, idle_timeout=0.3))


def raw(record: Record) -> bytes:
    headers = b"".join(k.encode() + (v or b"") for k, v in record.headers)
    return (record.key or b"") + (record.value or b"") + headers


def run_workflow(settings: Settings) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def query(args: dict[str, Any], key: str) -> NotFound:
        seen.append(args)
        raise RuntimeError(f"lookup failed for {args}")

    # Room for an intent's acknowledgement on a busy machine (0.3 s was once too short).
    tool = secret_tool(query=query, timeout_s=TOOL_TIMEOUT_S, max_attempts=1)
    options = ResumeOptions(grace_s=0, resolve_timeout_s=20)
    with Ledger(settings, tools=[tool], options=options) as ledger:
        wf = ledger.workflow(WF)

        def declined(args: dict[str, Any], key: str) -> None:
            raise ValueError(f"card {args['card']} cvv {args['cvv']} declined: {args!r}")

        with pytest.raises(ValueError, match=CARD):
            wf.step("declined", tool, ARGS, fn=declined)
        echoed = wf.step("charged", tool, ARGS, fn=lambda a, k: {"charge": "ch_1", "echo": a})
        assert echoed["echo"] == ARGS  # the caller gets its result as the tool returned it

        def timed_out(args: dict[str, Any], key: str) -> None:
            raise TimeoutError(f"no answer for payment {args['payment']}")

        with pytest.raises(StepInDoubtError) as doubt:
            wf.step("doubt", tool, ARGS, fn=timed_out)
        context = render(wf.context())
        time.sleep(TOOL_TIMEOUT_S + 0.1)  # past the intent's deadline: the resume settles it
        resumed = ledger.workflow(WF)
        assert resumed.state.steps["doubt"].escalation_open
    assert seen and all(args["card"] == MARKER for args in seen)
    return {"doubt": str(doubt.value), "context": context, "seen": seen}


def duckdb_cells(db: Path) -> str:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = {t: con.execute(f"SELECT * FROM {t}").fetchall() for t in TABLES}
    finally:
        con.close()
    return json.dumps(rows, default=str)


def test_no_secret_reaches_topic_dead_letters_duckdb_cli_or_logs(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    names = (settings.topic, settings.dlq_topic)  # random: kept out of the search
    seen = run_workflow(settings)

    events = records(settings, settings.topic)
    letters = records(settings, settings.dlq_topic)
    topic_bytes = b"".join(raw(r) for r in events)
    assert NOTE.encode() in topic_bytes  # the search sees the recorded arguments
    assert letters and [r.event.type for r in letters if r.event] == ["step_abandoned"]
    assert leaks(topic_bytes, ignore=names) == []
    assert leaks(b"".join(raw(r) for r in letters), ignore=names) == []

    db = tmp_path / "ledger.duckdb"
    with projecting(settings, db) as projector:
        projector.wait_received(len(events))
    cells = duckdb_cells(db)
    assert NOTE in cells and MARKER in cells
    assert leaks(cells, ignore=names) == []
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert leaks(path.read_bytes(), ignore=names) == [], path

    flags = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    runner = CliRunner()
    shown = runner.invoke(cli, ["workflows", "show", WF, *flags])
    assert shown.exit_code == 0 and "declined" in shown.output
    escalation = next(r.event for r in letters if r.event).body.escalation_id  # type: ignore[union-attr]
    assert isinstance(escalation, str)
    queue = runner.invoke(cli, ["escalations", "show", escalation, *flags])
    assert queue.exit_code == 0, queue.output
    for text in (shown.output, queue.output, seen["doubt"], seen["context"], caplog.text):
        assert leaks(text, ignore=names) == [], text

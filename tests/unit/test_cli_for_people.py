"""Command output a person reads: wide query results say how to see them whole, floats are
rounded in tables only, and a model turn is a one-line summary unless --full."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from stepledger.cli import _runtime, cli
from stepledger.cli._query import TABLE_WIDTH, display
from stepledger.cli._turns import LINE, turn_summary
from stepledger.domain.events import Event, ModelTurnReused
from stepledger.domain.tools import Tool
from stepledger.domain.usage import TurnUsage, recorded
from stepledger.log import InMemoryEventLog
from stepledger.testing import ledger_over
from stepledger.wire import MODEL_STEP_TOOL

LONG = "x" * 300


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.duckdb"
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE t AS SELECT '{LONG}' AS wide, 2.0 / 3 AS ratio, 1.5e-7 AS tiny")
    con.close()
    return path


def test_a_cut_table_says_how_to_see_it_whole_and_wide_prints_it(db: Path) -> None:
    runner = CliRunner()
    cut = runner.invoke(cli, ["query", "--db", str(db), "FROM t"])
    assert cut.exit_code == 0, cut.output
    assert LONG not in cut.stdout and "…" in cut.stdout
    assert "--wide, --json or --csv" in cut.stderr and f"fit into {TABLE_WIDTH}" in cut.stderr
    wide = runner.invoke(cli, ["query", "--db", str(db), "--wide", "FROM t"])
    assert LONG in wide.stdout and wide.stderr == ""
    narrow = runner.invoke(cli, ["query", "--db", str(db), "SELECT 1 AS a"])
    assert narrow.stderr == ""


def test_floats_are_rounded_in_the_table_and_exact_in_json_and_csv(db: Path) -> None:
    runner = CliRunner()
    table = runner.invoke(cli, ["query", "--db", str(db), "SELECT ratio, tiny FROM t"])
    assert "0.667" in table.stdout and "0.6666" not in table.stdout
    assert "1.5e-07" in table.stdout
    as_json = runner.invoke(cli, ["query", "--db", str(db), "--json", "SELECT ratio FROM t"])
    assert json.loads(as_json.stdout) == [{"ratio": 2.0 / 3}]
    as_csv = runner.invoke(cli, ["query", "--db", str(db), "--csv", "SELECT ratio FROM t"])
    assert as_csv.stdout == f"ratio\n{2.0 / 3}\n"
    both = runner.invoke(cli, ["query", "--db", str(db), "--json", "--csv", "FROM t"])
    assert both.exit_code == 2 and "give one" in both.output


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2.0 / 3, "0.667"), (12.5, "12.5"), (3.0, "3"), (0.0, "0.0"), (None, ""), (7, "7")],
)
def test_display_rounds_only_floats(value: object, shown: str) -> None:
    assert display(value) == shown


TURN = {
    "model_name": "gpt-test",
    "parts": [
        {"part_kind": "text", "content": "I will charge the card and then book " + "z" * 900},
        {"part_kind": "tool-call", "tool_name": "charge", "args": {"amount": 5}},
    ],
}


def test_a_model_turn_is_summarised_by_model_calls_and_a_preview() -> None:
    summary = turn_summary(TURN)
    assert summary.startswith('model=gpt-test calls=charge "I will charge the card')
    assert "--full" in summary and len(summary) < LINE


def _events_with_a_model_turn() -> list[Event]:
    """A turn recorded with its usage (the integrations' result), then reused by a replay."""
    log = InMemoryEventLog()
    model = Tool(name=MODEL_STEP_TOOL, read_only=True)
    wf = ledger_over(log, tools=[model]).workflow("wf-1")
    spent = TurnUsage(model="gpt-test", input_tokens=100, output_tokens=20)
    wf.step("turn-1", model, {"request": "d"}, fn=lambda _a, _k: recorded(TURN, spent))
    reused = ModelTurnReused(attempt=1, runner=wf.runner)
    wf.record(wf.ledger.events.envelope("wf-1", "turn-1", reused))
    return list(log.workflow_events("wf-1"))


def test_workflows_show_summarises_turns_and_full_prints_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = _events_with_a_model_turn()
    monkeypatch.setattr(_runtime, "_events", lambda *_: events)
    runner = CliRunner()
    short = runner.invoke(cli, ["workflows", "show", "wf-1"])
    assert short.exit_code == 0, short.output
    # What the workflow cost, and what the replay did not spend again.
    assert "spent: 1 model turns, 120 tokens (reused on resume: 1 turns, 120 tokens)" in (
        short.stdout
    )
    line = next(x for x in short.stdout.splitlines() if x.startswith("turn-1"))
    assert "model=gpt-test calls=charge" in line and len(line) < LINE + 40
    full = runner.invoke(cli, ["workflows", "show", "--full", "wf-1"])
    assert "z" * 900 in full.stdout

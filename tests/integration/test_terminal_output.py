"""What agents wrote cannot drive an operator's terminal or forge a line of its output."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.terminal import safe, shell_arg
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import cli, produce_events, projecting
from tests.unit.factories import factory, pay_tool

#: Retitles the terminal (OSC 0), then forges a line saying the workflow finished.
HOSTILE = "wf-\x1b]0;owned\x07\nworkflow_finished status=completed \x1b[2J\x9b31m"
STEP = "charge\r\x1b]52;c;ZWNobyBvd25lZA==\x07"
_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} ")


def _hostile_log(settings: Settings) -> int:
    make, tool = factory(), pay_tool()
    events = [
        make.workflow_started(HOSTILE, name="n", attempt=1, read_only=False, max_attempts=3),
        make.intent(HOSTILE, STEP, tool, {"note": "\x1b]0;x\x07"}, sequence=0),
        make.outcome(
            HOSTILE, STEP, attempt=1, status=OutcomeStatus.FAILED, error="bad\nline\x1b[1A"
        ),
    ]
    return produce_events(settings, events)


def _assert_inert(text: str) -> None:
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", text), repr(text)


def test_tail_prints_one_inert_line_per_event(settings: Settings, src_env: dict[str, str]) -> None:
    count = _hostile_log(settings)
    kafka = ("--bootstrap", settings.bootstrap, "--topic", settings.topic)
    done = cli(src_env, "tail", *kafka, "--from-beginning", "--no-follow")
    assert done.returncode == 0, done.stderr
    _assert_inert(done.stdout)
    lines = done.stdout.splitlines()
    assert len(lines) == count and all(_LINE.match(line) for line in lines), lines
    assert all(safe(HOSTILE) in line for line in lines)
    assert not any(line.startswith("workflow_finished") for line in lines)


def test_workflows_show_and_errors_are_inert(settings: Settings, src_env: dict[str, str]) -> None:
    _hostile_log(settings)
    kafka = ("--bootstrap", settings.bootstrap, "--topic", settings.topic)
    shown = cli(src_env, "workflows", "show", *kafka, HOSTILE)
    assert shown.returncode == 0, shown.stderr
    _assert_inert(shown.stdout)
    # A header and one line for the one step.
    assert len(shown.stdout.splitlines()) == 2, shown.stdout
    # An error naming the id stays one line.
    refused = cli(src_env, "workflows", "clear", *kafka, HOSTILE, "--by", "me")
    assert refused.returncode != 0
    _assert_inert(refused.stderr)
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_status_and_the_escalation_queue_are_inert(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    count = _hostile_log(settings)
    count += produce_events(settings, h.escalated_lookup(h.factory(), HOSTILE, "esc-hostile"))
    kafka = ("--bootstrap", settings.bootstrap, "--topic", settings.topic)
    listed = cli(src_env, "escalations", "list", *kafka)
    assert listed.returncode == 0, listed.stderr
    _assert_inert(listed.stdout)
    assert len(listed.stdout.splitlines()) == 1 and "esc-hostile" in listed.stdout
    db = tmp_path / "p.duckdb"
    with projecting(settings, db) as daemon:
        daemon.wait_received(count)
    shown = cli(src_env, "status", HOSTILE, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    _assert_inert(shown.stdout)
    assert safe(HOSTILE) in shown.stdout and "workflow_finished" not in shown.stdout.split("\n")[1]


def test_a_quoted_id_is_exactly_one_shell_argument_and_prints_inert() -> None:
    for hostile in (HOSTILE, STEP, "x; rm -rf ~", "$(touch owned)", "it's", "a\\nb", "é ü"):
        quoted = shell_arg(hostile)
        _assert_inert(quoted)
        assert "\n" not in quoted
        echoed = subprocess.run(
            ["bash", "-c", f"printf %s {quoted}"], capture_output=True, timeout=10, check=True
        )
        assert echoed.stdout.decode() == hostile

"""Escaping for people's terminals, and ids quoted in the commands hints print."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from stepledger.domain.tools import Tool
from stepledger.errors import ApprovalPendingError
from stepledger.terminal import safe, shell_arg
from tests.unit.resume_fakes import World

GATED = Tool(name="wire", effect="irreversible", requires_approval=True)


def test_every_control_character_becomes_a_visible_escape() -> None:
    controls = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]] + ["\u202e", "\u2028"]
    shown = safe("".join(controls))
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u202e]", shown)
    assert safe("a\nb\x1b]0;t\x07") == "a\\nb\\x1b]0;t\\x07"
    assert safe("ünïcode ok [red] \\n") == "ünïcode ok [red] \\n"
    assert safe(42) == "42"


def test_plain_ids_are_quoted_as_shlex_does() -> None:
    assert shell_arg("wf-1") == "wf-1"
    assert shell_arg("a b;c") == shlex.quote("a b;c")


def test_the_approval_hint_quotes_a_hostile_workflow_id() -> None:
    hostile = "wf\x1b]0;t\x07\n$(touch owned); echo"
    wf = World().ledger().workflow(hostile)
    with pytest.raises(ApprovalPendingError) as raised:
        wf.step("wire", GATED, {"amount": 1}, lambda a, k: None)
    hint = re.search(r"`(stepledger approve .*)`", raised.value.message)
    assert hint is not None and "\x1b" not in hint.group(1) and "\n" not in hint.group(1)
    # The copied command names exactly the workflow and step, and runs nothing else.
    words = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + hint.group(1).removeprefix("stepledger ")],
        capture_output=True,
        timeout=10,
        check=True,
    ).stdout.split(b"\0")[:-1]
    assert [w.decode() for w in words] == ["approve", hostile, "wire", "--digest", "D"]


def test_text_logs_escape_what_agents_wrote() -> None:
    import logging

    from stepledger.daemon.process import SafeTextFormatter

    record = logging.LogRecord(
        "stepledger", logging.INFO, "", 0, "step %s", ("a\n\x1b]0;t\x07",), None
    )
    line = SafeTextFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO step a\\n\\x1b]0;t\\x07"

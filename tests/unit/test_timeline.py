"""The timeline picture: valid SVG, one row per step, waits hatched, labels inert."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from stepledger.domain.state import replay
from stepledger.domain.tools import Tool
from stepledger.timeline import Mark, bars, timeline_svg
from tests.unit.factories import factory

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAY = Tool(name="pay", effect="idempotent", keyed=True)


def _steps(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "tl-step"]


def test_a_folded_workflow_draws_one_row_per_step_and_marks_answers() -> None:
    f = factory()
    hostile = "wf\x1b]0;owned\x07\n<script>alert(1)</script>"
    events = [
        f.workflow_started(hostile, name="n", attempt=1, read_only=False, max_attempts=3),
        f.intent(hostile, "charge", PAY, {"a": 1}, sequence=0),
        f.intent(hostile, "book\x9b2J", PAY, {"a": 2}, sequence=1),
    ]
    state = replay(hostile, events)
    answer = Mark(T0 + timedelta(hours=1), "happened by ana <b>")
    svg = timeline_svg(
        hostile, bars(state.steps.values()), now=T0 + timedelta(hours=2), marks=[answer]
    )
    root = ET.fromstring(svg)  # well-formed XML: no raw control character, markup escaped
    assert root.tag == f"{SVG}svg" and "<script>" not in svg and "\x1b" not in svg
    rows = _steps(root)
    assert len(rows) == 2 and {r.get("data-status") for r in rows} == {"intended"}
    # Both intents are in doubt: hatched up to now, waiting for a decision.
    fills = [r.find(f"{SVG}rect").get("fill") for r in rows]  # type: ignore[union-attr]
    assert fills == ["url(#tl-wait)", "url(#tl-wait)"]
    assert "waits for a decision" in svg and "happened by ana &lt;b&gt;" in svg
    assert "book\\x9b2J" in svg


def test_decided_steps_say_who_decided_and_which_attempt() -> None:
    rows = [
        {
            "step_id": "charge",
            "tool": "pay",
            "status": "succeeded",
            "attempt": 2,
            "recovery_attempts": 1,
            "resolved_by": "recovery_query",
            "first_at": T0,
            "resolved_at": T0 + timedelta(seconds=30),
        },
        {"step_id": "wire", "tool": "bank", "status": "awaiting_approval", "first_at": T0},
    ]
    svg = timeline_svg("wf", bars(rows), now=T0 + timedelta(minutes=1))
    root = ET.fromstring(svg)
    first, second = _steps(root)
    assert "attempt 2, recovery tried 1x, decided by recovery (query)" in ET.tostring(
        first, encoding="unicode"
    )
    assert first.find(f"{SVG}rect").get("fill") == "#2e7d32"  # type: ignore[union-attr]
    assert "waits for a person" in ET.tostring(second, encoding="unicode")
    assert timeline_svg("empty", [], now=T0).count("no steps recorded yet") == 1

"""Every Python snippet in README.md and docs/*.md runs, so the examples cannot rot.

Snippets of one document run in order in one namespace (a later one may use what an
earlier one defined), against the test broker: ``STEPLEDGER_BOOTSTRAP`` and a fresh
``STEPLEDGER_TOPIC`` are set, so ``sl.load_settings()`` finds them as a user's would.  A
snippet that cannot run on its own (it needs a running projector, or is a fragment of an
agent) is marked on the line before its fence: ``<!-- fragment: why -->``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from stepledger.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)\n```", re.S)
FRONT_DOOR_LIMIT = 8


def snippets(path: Path) -> list[tuple[int, str, bool]]:
    """(line, code, runnable) of every python block of a document."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("code"))
        fragment = match.group("before").strip().startswith("<!-- fragment")
        found.append((line, match.group("code"), not fragment))
    return found


def test_every_document_with_snippets_is_checked() -> None:
    with_code = [p.name for p in DOCS if snippets(p)]
    assert "README.md" in with_code and "agents.md" in with_code


@pytest.mark.parametrize("doc", [p for p in DOCS if snippets(p)], ids=lambda p: p.name)
def test_the_snippets_run(
    doc: Path,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    settings = make_settings()
    monkeypatch.setenv("STEPLEDGER_BOOTSTRAP", settings.bootstrap)
    monkeypatch.setenv("STEPLEDGER_TOPIC", settings.topic)
    monkeypatch.setenv("STEPLEDGER_DLQ_TOPIC", settings.dlq_topic)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"snippets_{doc.stem}"}
    for line, code, runnable in snippets(doc):
        if not runnable:
            compile(code, f"{doc.name}:{line}", "exec")  # a fragment must still parse
            continue
        exec(compile(code, f"{doc.name}:{line}", "exec"), namespace)


def test_the_front_door_program_is_at_most_eight_lines() -> None:
    first = snippets(ROOT / "README.md")[0][1]
    lines = [line for line in first.splitlines() if line.strip()]
    assert lines[0] == "import stepledger as sl"
    assert len(lines) <= FRONT_DOOR_LIMIT, lines
    assert all("stepledger." not in line for line in lines[1:]), "only the front door"

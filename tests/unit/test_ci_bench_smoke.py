"""CI's bench smoke runs every bench's quick path: none is left out to save time."""

from __future__ import annotations

import re
from pathlib import Path


def test_the_bench_smoke_runs_every_bench() -> None:
    run = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    smokes = re.findall(r"python -m bench --quick([^\n]*)", run)
    assert len(smokes) == 1, smokes
    assert "--only" not in smokes[0] and "--skip" not in smokes[0]

"""CI's bench smoke runs in two halves: together they must be every bench, each once."""

from __future__ import annotations

import re
from pathlib import Path

from bench.__main__ import BENCHES


def test_the_two_halves_of_the_bench_smoke_are_every_bench_once() -> None:
    run = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    halves = re.findall(r"python -m bench --quick[\s\\]*--only ([a-z_,]+)", run)
    assert len(halves) == 2, halves
    named = [name for half in halves for name in half.split(",")]
    assert sorted(named) == sorted(BENCHES)

"""Opening one workflow out of a growing topic: the default readers vs the old full scan.

For topics of 10k, 100k and 1M events (quick: 2k and 10k), each holding one unfinished
target workflow among finished ones, a fresh ``Ledger`` opens the target
(``ledger.workflow(id)``: read, fold, append ``workflow_resumed``), timed three ways:

- default, no projection: ``KafkaHistory`` reads the workflow's own partition only
  (the topic has 3 partitions: about a third of the log);
- default with ``Settings(projection=...)``: ``SnapshotTailReader``, the projector's
  snapshot lookup plus the partition's tail after it (1k events written after the snapshot);
- the old default: every partition from the beginning (context).

``python -m bench.open [--quick] [--bootstrap HOST:PORT]``
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Row, broker, cli, fresh_settings
from bench.resume import TARGET, FullScan, _events, fill
from stepledger.config import Settings
from stepledger.producer import Ledger, WorkflowReader
from stepledger.projector.rebuild import rebuild

TAIL = 1_000
REPEATS = 5


def prepare(bootstrap: str, events: int, workdir: Path, tail: int = TAIL) -> tuple[Settings, Path]:
    """A topic of about ``events`` events with the target in the middle, projected, plus a tail."""
    settings = fresh_settings(bootstrap)
    fill(settings, events // 2, "a")
    with Ledger(settings) as ledger:
        for event in _events(ledger.events, TARGET, finished=False):
            ledger.log.append(event)
    fill(settings, events - events // 2, "b")
    db = workdir / f"{settings.topic}.duckdb"
    rebuild(settings, db)
    fill(settings, tail, "tail", workers=1)
    return settings, db


def open_once(settings: Settings, reader: WorkflowReader | None = None) -> float:
    """Seconds for a fresh ledger (a new process) to open the target workflow."""
    began = time.perf_counter()
    with Ledger(settings, reader=reader) as ledger:
        wf = ledger.workflow(TARGET)
        assert wf.attempt >= 2 and len(wf.state.steps) == 4
        return time.perf_counter() - began


def measure(settings: Settings, projected: Settings, repeats: int = REPEATS) -> dict[str, float]:
    """Median open time of each reader on one prepared topic."""
    return {
        "default, no projection (own partition)": statistics.median(
            open_once(settings) for _ in range(repeats)
        ),
        "default with a projection (snapshot + partition tail)": statistics.median(
            open_once(projected) for _ in range(repeats)
        ),
        "old default: full topic scan": statistics.median(
            open_once(settings, FullScan(settings)) for _ in range(min(3, repeats))
        ),
    }


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Open time against topic size, for each reader."""
    sizes = (2_000, 10_000) if quick else (10_000, 100_000, 1_000_000)
    tail, repeats = (200, 2) if quick else (TAIL, REPEATS)
    rows: list[Row] = []
    with broker(bootstrap) as servers, tempfile.TemporaryDirectory() as tmp:
        first: dict[str, float] = {}
        for size in sizes:
            settings, db = prepare(servers, size, Path(tmp), tail)
            projected = settings.model_copy(update={"projection": str(db)})
            figures = measure(settings, projected, repeats)
            for name, seconds in figures.items():
                first.setdefault(name, seconds)
                rows.append(
                    Row(
                        "open",
                        f"open a workflow, {size // 1000}k events: {name} (vs {sizes[0] // 1000}k)",
                        seconds * 1000,
                        first[name] * 1000,
                        "ms",
                        "",
                        False,
                    )
                )
            print(
                f"[open] {size} events: "
                + ", ".join(f"{k}: {v * 1000:.0f} ms" for k, v in figures.items()),
                flush=True,
            )
    return rows


if __name__ == "__main__":
    cli(run, __doc__)

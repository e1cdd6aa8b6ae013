"""The inbox's first page over a large queue: 10,000 open cases (quick: 200).

- Setup: a projection holding that many open cases (four in five escalations, one in five
  pending approvals) beside as many settled workflows of three steps each, built by the
  projector's own engine (no broker needed: the queue reads only the projection).
- Measure: ``stepledger inbox`` as a real process on loopback; GET ``/`` (the first
  page, newest first, with the facet counts) over HTTP with the bearer token: the first
  request after start, then the median and p95 of repeated ones, and a filtered page
  (one tool, older than 1 minute).  Target: the first page under 300 ms.
- Baseline: the same page's rows straight from DuckDB (connect to the file, one SELECT of
  50 rows): what any page costs at least.

``python -m bench.inbox [--quick]``
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import Row, cli, fixed_clock, median, percentile
from stepledger.codec import Codec
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool
from stepledger.humanqueue.queue import QueueFilter, QueueSource
from stepledger.kafka.records import Consumed
from stepledger.projector.engine import Projector
from stepledger.projector.snapshot import connect_read_only, snapshot_path
from stepledger.projector.store import ProjectionStore

TOKEN = "bench-inbox-token-0123456789"
TOOLS = [
    Tool(name=f"tool_{n}", effect="irreversible", run=lambda args, key: None) for n in range(8)
]
PARTITIONS = 3
REPEATS = 40
PUBLISHES = 8
TARGET_MS = 300.0


def _events(cases: int) -> list[ev.Event]:
    start = datetime.now(UTC) - timedelta(days=2)
    out: list[ev.Event] = []
    for n in range(cases):
        at = start + timedelta(seconds=15 * n)
        f = EventFactory(f"fleet-{n % 5}", "bench", clock=fixed_clock(at))
        tool = TOOLS[n % len(TOOLS)]
        wf = f"open-{n:06d}"
        if n % 5 == 4:
            out.append(f.envelope(wf, "pivot", ev.ApprovalRequested(tool=tool.name)))
        else:
            out.append(f.intent(wf, "step", tool, {"n": n}, sequence=0))
            abandoned = ev.StepAbandoned(
                reason="policy escalate", escalation_id=f"esc-{n:06d}", source=Source.RECOVERY
            )
            out.append(f.envelope(wf, "step", abandoned))
        done = f"done-{n:06d}"
        for seq in range(3):
            out.append(f.intent(done, f"s{seq}", tool, {"seq": seq}, sequence=seq))
            out.append(f.outcome(done, f"s{seq}", attempt=1, status=OutcomeStatus.SUCCEEDED))
    return out


def build_projection(path: Path, cases: int) -> int:
    """Project the synthetic log into a fresh file; return how many events it holds."""
    codec = Codec()
    offsets = [0] * PARTITIONS
    messages = []
    for event in _events(cases):
        key = event.workflow_id.encode()
        p = zlib.crc32(key) % PARTITIONS
        value = codec.encode(event)
        messages.append(Consumed("log", p, offsets[p], key, value))
        offsets[p] += 1
    with ProjectionStore(path) as store:
        projector = Projector(store, codec, MemoryRecordLetters())
        for i in range(0, len(messages), 20_000):
            projector.process(messages[i : i + 20_000])
        store.checkpoint()
    return len(messages)


def _start_inbox(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepledger",
            "inbox",
            "--db",
            str(db),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The token never goes on a command line (every local user can read those).
        env={**os.environ, "STEPLEDGER_INBOX_TOKEN": TOKEN},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if "open http" in line:
                return proc, line.split("open ", 1)[1].split("/?")[0]
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the inbox did not start")


def _get_ms(url: str) -> tuple[float, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return (time.perf_counter() - began) * 1000, body


def _after_publish(db: Path, base: str) -> float:
    """The first page after the projector published a new snapshot (a new file to open)."""
    target = snapshot_path(db)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(db, partial)
    os.replace(partial, target)
    return _get_ms(base + "/")[0]


def _raw_page_ms(db: Path) -> float:
    began = time.perf_counter()
    con = connect_read_only(db)
    try:
        con.execute(
            "SELECT escalation_id, workflow_id, step_id, fleet_id, reason, opened_at "
            "FROM escalations WHERE status = 'open' ORDER BY opened_at DESC LIMIT 50"
        ).fetchall()
    finally:
        con.close()
    return (time.perf_counter() - began) * 1000


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """Build the projection, serve it, and time the first page."""
    del bootstrap  # the queue reads the projection only: no broker involved
    cases = 200 if quick else 10_000
    with tempfile.TemporaryDirectory(prefix="bench-inbox-") as tmp:
        db = Path(tmp) / "ledger.duckdb"
        began = time.perf_counter()
        events = build_projection(db, cases)
        built_s = time.perf_counter() - began
        # What the projector publishes between batches: the inbox reads this copy.
        shutil.copyfile(db, snapshot_path(db))
        source = QueueSource(db)
        try:
            page = source.page(QueueFilter())
        finally:
            source.close()
        assert page.total == cases, (page.total, cases)
        proc, base = _start_inbox(db)
        try:
            first, body = _get_ms(base + "/")
            assert f'<span id="total">{cases}</span>'.encode() in body
            pages = [_get_ms(base + "/")[0] for _ in range(REPEATS)]
            filtered = [_get_ms(base + "/?tool=tool_3&age=1m")[0] for _ in range(REPEATS)]
            fresh = [_after_publish(db, base) for _ in range(PUBLISHES)]
        finally:
            proc.terminate()
            proc.wait(20)
        raw = [_raw_page_ms(db) for _ in range(REPEATS)]
    return _rows(cases, events, built_s, first, pages, filtered, fresh, raw)


def _rows(
    cases: int,
    events: int,
    built_s: float,
    first: float,
    pages: list[float],
    filtered: list[float],
    fresh: list[float],
    raw: list[float],
) -> list[Row]:
    name = f"{cases:,} open cases"
    raw_p50 = median(raw)
    rows: list[Any] = [
        Row(
            "inbox",
            f"{name}: first page, first request (target < {TARGET_MS:g} ms)",
            first,
            raw_p50,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"{name}: first page p50 (vs raw DuckDB page query p50)",
            median(pages),
            raw_p50,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"{name}: first page p95",
            percentile(pages, 95),
            None,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"{name}: first page after a new snapshot, median of {len(fresh)} (< {TARGET_MS:g} ms)",
            median(fresh),
            raw_p50,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"{name}: first page after a new snapshot, worst",
            max(fresh),
            None,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"{name}: filtered page (tool, age) p50",
            median(filtered),
            None,
            "ms",
            higher_is_better=False,
        ),
        Row(
            "inbox",
            f"setup: projection of {events:,} events built",
            built_s,
            None,
            "s",
            higher_is_better=False,
        ),
    ]
    return rows


if __name__ == "__main__":
    cli(run, __doc__)

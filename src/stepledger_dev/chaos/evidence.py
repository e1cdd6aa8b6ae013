"""Gathering what a chaos run left behind: the log, the ack journals, the services' effects."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import duckdb

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.kafka.reader import read_topic
from stepledger.projector.schema import TABLES
from stepledger.readers.lake import LakeSource, connect_lake_reader
from stepledger.readers.snapshots import connect_union

#: A projection to compare: a file, a shard directory, several members' directories, a lake.
Projection = Path | list[Path] | LakeSource


def read_log(settings: Settings) -> tuple[list[Event], int]:
    """Every decodable event of the topic, and how many records did not decode."""
    events, bad = [], 0
    for record in read_topic(settings, Codec(), idle_timeout=1.0):
        if record.event is None:
            bad += 1
        else:
            events.append(record.event)
    return events, bad


def read_acks(paths: list[Path]) -> set[str]:
    """Every event id the agents saw acknowledged."""
    acked: set[str] = set()
    for path in paths:
        if path.exists():
            acked.update(line.strip() for line in path.read_text().splitlines() if line.strip())
    return acked


def effect_counts(state: Path) -> dict[str, dict[str, int]]:
    """A service's real effects by kind and key, read from its state file."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    with _sqlite(state) as con:
        for kind, key, n in con.execute(
            "SELECT kind, key, COUNT(*) FROM effects WHERE key IS NOT NULL GROUP BY kind, key"
        ):
            counts[kind][key] = n
    return dict(counts)


def records_by(state: Path, kind: str, field: str, transform: Any = str) -> dict[str, int]:
    """How many records of a kind each value of a body field has (e.g. charges per customer)."""
    with _sqlite(state) as con:
        rows = con.execute("SELECT body FROM records WHERE kind = ?", (kind,)).fetchall()
    return dict(Counter(transform(json.loads(body)[field]) for (body,) in rows))


def standing_records(state: Path, kind: str, field: str, status: str) -> dict[str, int]:
    """Records of a kind still in an effect's live status (a charge "captured", not refunded)."""
    with _sqlite(state) as con:
        rows = con.execute("SELECT body FROM records WHERE kind = ?", (kind,)).fetchall()
    bodies = [json.loads(body) for (body,) in rows]
    return dict(Counter(str(b[field]) for b in bodies if b.get("status") == status))


def refunds_by_customer(state: Path) -> dict[str, int]:
    """Refunds per customer of the charge they undid (a refund records the charge's key)."""
    with _sqlite(state) as con:
        rows = con.execute(
            "SELECT kind, body FROM records WHERE kind IN ('charge', 'refund')"
        ).fetchall()
    bodies = [(kind, json.loads(body)) for kind, body in rows]
    customer = {b["idempotency_key"]: str(b["customer"]) for k, b in bodies if k == "charge"}
    return dict(Counter(customer.get(b["charge_key"], "?") for k, b in bodies if k == "refund"))


def email_workflow(address: str) -> str:
    """The workflow an example email went to (``WORKFLOW@example.test``)."""
    return address.rsplit("@", 1)[0]


def projection_diff(live: Projection, rebuilt: Projection) -> list[str]:
    """Every table whose content differs between the live projection and a rebuild.

    ``live`` is one file, one shard directory, the shard directories of projectors that
    share no volume (read as the union of each partition's freshest shard), or a lake.
    """
    a, b = _tables(live), _tables(rebuilt)
    diffs = []
    for table in TABLES:
        if a[table] != b[table]:
            only_a = len(set(a[table]) - set(b[table]))
            only_b = len(set(b[table]) - set(a[table]))
            diffs.append(
                f"table {table}: {len(a[table])} rows live vs {len(b[table])} rebuilt "
                f"({only_a} only live, {only_b} only rebuilt)"
            )
    return diffs


#: The log lines of a member that found no state for a partition and replays it from 0.
REPLAY_LINES = {
    "projector": re.compile(r"no (?:shard|table set) for (\S+)\[(\d+)\]"),
    "recovery": re.compile(r"no checkpoint for (\S+)\[(\d+)\]"),
}


def replays_by_member(logs: list[Path], role: str, topic: str) -> dict[str, dict[int, int]]:
    """Per member (its log's name), how often it replayed each partition from offset 0."""
    found: dict[str, dict[int, int]] = {}
    for path in logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        counts = Counter(int(p) for t, p in REPLAY_LINES[role].findall(text) if t == topic)
        found[path.stem] = dict(counts)
    return found


def replays_from_zero(logs: dict[str, list[Path]], topic: str) -> dict[str, dict[int, int]]:
    """Per role, how often each partition of the topic was replayed from offset 0 (from logs)."""
    found: dict[str, dict[int, int]] = {}
    for role, paths in logs.items():
        counts: Counter[int] = Counter()
        for path in paths:
            text = path.read_text(errors="replace") if path.exists() else ""
            counts.update(int(p) for t, p in REPLAY_LINES[role].findall(text) if t == topic)
        found[role] = dict(counts)
    return found


def _tables(path: Projection) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows; shard directories are read as the union of their shards' snapshots."""
    if isinstance(path, LakeSource):
        con = connect_lake_reader(path.config, path.log)
    elif isinstance(path, list):
        con = connect_union(*path)
    elif path.is_dir():
        con = connect_union(path)
    else:
        con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()


class _sqlite:
    def __init__(self, path: Path) -> None:
        self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)

    def __enter__(self) -> sqlite3.Connection:
        return self.con

    def __exit__(self, *exc: object) -> None:
        self.con.close()

"""CPU per event of the projector's stages vs the raw pipeline, in process, without a broker.

Less sensitive to machine load than wall-clock ratios: 30k bench events as consumed
records; the raw pipeline (fastavro decode, Arrow, one insert per 10k) and the projector's
``prepare`` (decode, fold, rows, Arrow; the main thread) and ``commit`` (DuckDB) are timed
in CPU seconds, both with the projector's DuckDB settings; min of 3 rounds.

``python -m bench.projector_cpu``
"""

from __future__ import annotations

import gc
import io
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import duckdb
import fastavro
import pyarrow as pa

from bench.projector import _RAW_COLUMNS, workload
from stepledger.codec import Codec
from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.kafka.records import Consumed
from stepledger.projector.engine import Projector
from stepledger.projector.store import CHECKPOINT_THRESHOLD, DEFAULT_MEMORY_LIMIT, ProjectionStore

N = 30_000
_ENVELOPE = ("event_id", "workflow_id", "step_id", "fleet_id", "producer_id", "occurred_at")


def _messages() -> list[Consumed]:
    offsets = [0, 0, 0]
    out = []
    for key, value in workload(N):
        p = zlib.crc32(key) % 3
        out.append(Consumed("t", p, offsets[p], key, value))
        offsets[p] += 1
    return out


def _raw(msgs: list[Consumed], db: Path, schema: Any) -> float:
    con = duckdb.connect(str(db), config={"memory_limit": DEFAULT_MEMORY_LIMIT})
    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    con.execute(
        "CREATE TABLE events (event_id VARCHAR, workflow_id VARCHAR, step_id VARCHAR, "
        "fleet_id VARCHAR, producer_id VARCHAR, occurred_at TIMESTAMPTZ, type VARCHAR, "
        "topic VARCHAR, partition INTEGER, log_offset BIGINT, value BLOB)"
    )
    start = time.process_time()
    for i in range(0, N, 10_000):
        cols: dict[str, list[Any]] = {k: [] for k in _RAW_COLUMNS}
        for msg in msgs[i : i + 10_000]:
            value = msg.value or b""
            r: Any = fastavro.schemaless_reader(
                io.BytesIO(value[10:]), schema, None, return_record_name=True
            )
            for name in _ENVELOPE:
                cols[name].append(r[name])
            cols["type"].append(r["body"][0])
            cols["topic"].append(msg.topic)
            cols["partition"].append(msg.partition)
            cols["log_offset"].append(msg.offset)
            cols["value"].append(value)
        con.register("batch", pa.table(cols))
        con.execute("INSERT INTO events SELECT * FROM batch")
        con.unregister("batch")
    spent = time.process_time() - start
    con.close()
    return spent


def _projector(batches: list[list[Consumed]], db: Path, codec: Codec) -> tuple[float, float]:
    prepare = commit = 0.0
    with ProjectionStore(db) as store:
        projector = Projector(store, codec, MemoryRecordLetters())
        for records in batches:
            t0 = time.thread_time()
            batch = projector.prepare(records)
            t1 = time.thread_time()
            projector.commit(batch)
            commit += time.thread_time() - t1
            prepare += t1 - t0
            projector.cache.trim()
    return prepare, commit


def main() -> None:
    """Print CPU µs per event: raw, projector prepare, projector commit."""
    msgs = _messages()
    batches: list[list[Consumed]] = []
    for i in range(0, N, 10_000):
        by_partition: dict[int, list[Consumed]] = {}
        for m in msgs[i : i + 10_000]:
            by_partition.setdefault(m.partition, []).append(m)
        batches.extend(by_partition.values())
    codec = Codec()
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)  # as the daemon does
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            raw = _raw(msgs, Path(tmp) / f"raw{i}.duckdb", codec.schema)
            rounds.append((raw, *_projector(batches, Path(tmp) / f"p{i}.duckdb", codec)))
    raw, prepare, commit = (min(r[k] for r in rounds) / N * 1e6 for k in range(3))
    print(
        f"raw {raw:.1f} us/event CPU; projector prepare (main thread) {prepare:.1f}, "
        f"commit {commit:.1f}; raw / prepare {raw / prepare:.2f}"
    )


if __name__ == "__main__":
    main()

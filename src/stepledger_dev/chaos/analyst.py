"""An analyst in a process of its own, reading the lake while the chaos run writes it.

``python -m stepledger_dev.chaos.analyst --log TOPIC --out FILE`` (the lake's catalog and
bucket from ``STEPLEDGER_LAKE``, ``STEPLEDGER_LAKE_DATA_PATH`` and the usual AWS variables)
reads the lake over and over, each time in one statement, so at one lake snapshot, until
SIGTERM, and appends one JSON line per read (a *cut*) to ``FILE``: how many partitions and
records it saw, and what in it was out of step:

- ``partitions_apart``: partitions whose events are not exactly the offsets ``0 ..
  next_offset - 1`` of the lake's offset (rows committed without their offset, or the
  offset without its rows);
- ``workflows_apart``: workflows whose ``steps`` count is not their rows in ``steps`` (the
  steps and the workflows tables read at different offsets).

A read that fails (the lake has no tables yet, a reconnect) is a line with its error, not a
cut.  The harness (:mod:`stepledger_dev.chaos.lake_run`) judges the lines.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click
import duckdb

from stepledger.errors import StepLedgerError
from stepledger.readers.lake import LakeConfig, connect_lake_reader, first_line

#: One statement, so one snapshot of the lake: each partition's events against its offset,
#: each workflow's steps count against its rows in ``steps``.
CUT_SQL = """
WITH per_partition AS (
    SELECT o.topic, o.partition, o.next_offset,
           count(e.log_offset) AS n, coalesce(max(e.log_offset), -1) AS top,
           count(DISTINCT e.log_offset) AS distinct_offsets
    FROM offsets o LEFT JOIN events e ON e.topic = o.topic AND e.partition = o.partition
    GROUP BY ALL
),
step_rows AS (SELECT workflow_id, count(*) AS n FROM steps GROUP BY ALL)
SELECT
    (SELECT count(*) FROM per_partition) AS partitions,
    (SELECT coalesce(sum(next_offset), 0) FROM per_partition) AS records,
    (SELECT count(*) FROM workflows) AS workflows,
    (SELECT count(*) FROM per_partition
      WHERE n <> next_offset OR top <> next_offset - 1 OR distinct_offsets <> n)
      AS partitions_apart,
    (SELECT count(*) FROM workflows w FULL JOIN step_rows s USING (workflow_id)
      WHERE coalesce(w.steps, 0) <> coalesce(s.n, 0)) AS workflows_apart
"""
COLUMNS = ("partitions", "records", "workflows", "partitions_apart", "workflows_apart")


class _Stop:
    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self._ask)
        signal.signal(signal.SIGINT, self._ask)

    def _ask(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True


def read_cut(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """One consistent read of the lake: the figures of :data:`CUT_SQL`."""
    row = con.execute(CUT_SQL).fetchone()
    assert row is not None
    return {name: int(value) for name, value in zip(COLUMNS, row, strict=True)}


@click.command()
@click.option("--log", "log", required=True, help="The step log whose tables are read.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--every", default=0.3, show_default=True, type=click.FloatRange(0.0))
@click.option("--max-reads", default=10_000, show_default=True, type=click.IntRange(1))
def main(log: str, out: Path, every: float, max_reads: int) -> None:
    """Read the lake in cuts until SIGTERM (or ``--max-reads``); one JSON line each."""
    stop = _Stop()
    config = LakeConfig.from_env(
        os.environ["STEPLEDGER_LAKE"], os.environ.get("STEPLEDGER_LAKE_DATA_PATH", "")
    )
    con: duckdb.DuckDBPyConnection | None = None
    with out.open("a") as lines:
        for _ in range(max_reads):
            if stop.asked:
                break
            began = time.monotonic()
            try:
                if con is None:
                    con = connect_lake_reader(config, log)
                found: dict[str, Any] = read_cut(con)
            except (duckdb.Error, StepLedgerError) as exc:
                found = {"error": first_line(exc)}
                if con is not None:
                    con.close()
                con = None
            found["seconds"] = round(time.monotonic() - began, 3)
            lines.write(json.dumps(found) + "\n")
            lines.flush()
            time.sleep(every)
    if con is not None:
        con.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

"""The chaos run's lake variant: every projector commits to one DuckLake.

With ``--lake`` the run is the scale-out run without a shared volume (a checkpointer,
recovery state on its changelog, agents opening workflows from Kafka), its projectors
committing to one lake (a PostgreSQL catalog, a bucket), each with a state directory of its
own; they are killed, stopped past their session and added as in the file mode.  What the
lake adds to the invariants:

- the lake equals a rebuild into a fresh lake (``--rebuild-lake``), table for table, its
  offsets table included, so every partition's offset is exact;
- each partition was read from offset 0 once, by its first owner: a later owner, on
  another state directory, continues from the lake's offset;
- an analyst in a third process (:mod:`stepledger_dev.chaos.analyst`) read the lake during
  the run and saw one consistent cut every time: events at their partition's offset,
  workflows at their steps.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import duckdb

from stepledger.config import Settings
from stepledger.errors import StepLedgerError
from stepledger.readers.lake import LakeConfig, LakeSource, connect_lake_reader
from stepledger_dev.chaos.invariants import InvariantViolation
from stepledger_dev.chaos.procs import Proc
from stepledger_dev.stack import LocalStack

ANALYST = [sys.executable, "-m", "stepledger_dev.chaos.analyst"]
#: Reads the analyst must have made with records in them for the run to count as read.
MIN_CUTS = 3


def lake_offsets(lake: LakeConfig, log: str) -> dict[int, int]:
    """Each partition's next offset in the lake ({} before any table set exists)."""
    try:
        con = connect_lake_reader(lake, log)
    except StepLedgerError:
        return {}
    try:
        rows = con.execute("SELECT partition, next_offset FROM offsets").fetchall()
    except duckdb.Error:  # the schema is there, its views not yet: none
        return {}
    finally:
        con.close()
    return {int(p): int(o) for p, o in rows}


def start_analyst(stack: LocalStack, lake: LakeConfig) -> Proc:
    """The analyst process, reading the lake until stopped."""
    out = stack.workdir / "analyst.jsonl"
    argv = [*ANALYST, "--log", stack.settings.topic, "--out", str(out)]
    env = stack.child_env(
        role="analyst", STEPLEDGER_LAKE=lake.catalog, STEPLEDGER_LAKE_DATA_PATH=lake.data_path
    )
    proc = Proc("analyst", argv, env, stack.workdir / "analyst.log").start()
    stack.track("analyst", proc.process)  # stopped with the stack if the run is interrupted
    return proc


def analyst_cuts(stack: LocalStack) -> list[dict[str, Any]]:
    """The analyst's reads, in order (failed reads included, with their error)."""
    path = stack.workdir / "analyst.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def analyst_violations(cuts: list[dict[str, Any]]) -> list[InvariantViolation]:
    """A cut out of step, or too few reads of a lake with records in it."""
    found = [
        InvariantViolation(
            "analyst_consistent_cut",
            None,
            f"read {i}: {cut['partitions_apart']} partition(s) with events not at their "
            f"offset, {cut['workflows_apart']} workflow(s) not at their steps ({cut})",
        )
        for i, cut in enumerate(cuts)
        if cut.get("partitions_apart") or cut.get("workflows_apart")
    ]
    read = [c for c in cuts if c.get("records")]
    if len(read) < MIN_CUTS:
        errors = sorted({str(c["error"]) for c in cuts if "error" in c})[:3]
        detail = f"{len(read)} read(s) with records (errors: {errors})"
        found.append(InvariantViolation("analyst_read_the_lake", None, detail))
    return found


def lake_evidence(
    settings: Settings, lake: LakeConfig, fresh: LakeConfig
) -> tuple[LakeSource, LakeSource]:
    """Rebuild the log into the fresh lake; (the live lake, the rebuilt one) as sources."""
    from stepledger.projector.rebuild_lake import rebuild_lake

    rebuild_lake(settings, fresh)
    return LakeSource(lake, settings.topic), LakeSource(fresh, settings.topic)

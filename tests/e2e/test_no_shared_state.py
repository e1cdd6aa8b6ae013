"""Scaling out with no shared volume: 2 projectors and 2 recovery daemons, nothing shared but Kafka.

The run is ``stepledger chaos --projectors 2 --recoverers 2 --no-shared-state`` on Apache
Kafka: each projector projects into a shard directory of its own, each recovery daemon keeps
its partition state on the compacted changelog (``--state-in-kafka``) with a state directory
of its own, a checkpointer writes the workflow checkpoints, and the agents open workflows
from Kafka.  Members are SIGKILLed, SIGSTOPped past their session and added while agents die
at their crash points.  Besides every chaos invariant (each in-doubt step attempt decided by
one daemon, no effect repeated), the union of the members' directories (each partition's
freshest shard) equals a single-process rebuild.  What a shared-volume deployment never
sees is asserted too: a partition moved to a member whose directory never had its shard
(replayed from offset 0 by several members), and a member that lost a partition left a
stale shard behind that the union must not read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from stepledger.readers.snapshots import (
    freshest_shard_snapshots,
    shard_snapshots,
    snapshot_next_offset,
)
from tests.e2e.test_chaos import external, run_chaos

__all__ = ["external"]

PARTITIONS = 8


def shard_offsets(directory: Path) -> dict[int, int]:
    """Each partition's stored next offset in one member's published snapshots."""
    return {
        where[1]: snapshot_next_offset(path, where)
        for where, path in shard_snapshots(directory).items()
    }


@pytest.mark.e2e
@pytest.mark.kafka_only
@pytest.mark.timeout(240)
def test_members_with_separate_directories_killed_stopped_and_added_equal_a_rebuild(
    tmp_path: Path, src_env: dict[str, str], external: Callable[..., list[str]]
) -> None:
    args = ("--projectors", "2", "--recoverers", "2", "--no-shared-state")
    given = external(*args, "--workflows", "12", "--seed", "3", "--duration", "150")
    code, report, output = run_chaos(tmp_path, src_env, *given)
    assert code == 0, output
    assert report["passed"] and report["violations"] == [], report["violations"]
    counts = {row["point"]: row["count"] for row in report["crash_points"]}
    assert counts.get("projector:mid_batch") == 1 and counts.get("projector:added") == 1
    assert counts.get("recovery:mid_resolution") == 1 and counts.get("recovery:added") == 1
    assert counts.get("agent:after_intent", 0) >= 1, "no step was left in doubt"
    assert report["decided_by_daemons"] >= 1, "no in-doubt step reached a recovery daemon"
    assert report["members"] == {"projector": 3, "recovery": 3}
    assert "--no-shared-state" in report["replay"]

    work = tmp_path / "work"
    assert not (work / "shards").exists() and not (work / "recovery-shared").exists()
    written = re.search(r"(\d+) checkpoints written", (work / "checkpointer.log").read_text())
    assert written and int(written[1]) > 0, "the checkpointer wrote nothing"
    members = sorted(p for p in work.glob("projector-*") if p.is_dir())
    # One directory per member (the added one has none if it ended before it started up).
    names = {m.name for m in members}
    assert {"projector-0", "projector-1"} <= names <= {f"projector-{n}" for n in range(3)}
    # A partition moved to a member whose directory never had its shard: it was replayed
    # from offset 0 there (a shared volume would have handed over the shard instead).
    by_member = report["projector_replays_by_member"]
    replays = {p: sum(c.get(str(p), 0) for c in by_member.values()) for p in range(PARTITIONS)}
    assert max(replays.values()) >= 2, by_member
    # A member that lost a partition left its shard behind, behind the partition's freshest;
    # the union the run compared with the rebuild read the freshest one.
    offsets = {m.name: shard_offsets(m) for m in members}
    # Rows of one partition in several directories: a plain union would count them twice.
    doubled = [p for p in range(PARTITIONS) if sum(o.get(p, -1) > 0 for o in offsets.values()) >= 2]
    assert doubled, offsets
    stale = [p for p in range(PARTITIONS) if len({o[p] for o in offsets.values() if p in o}) > 1]
    assert stale, offsets
    freshest = freshest_shard_snapshots(*members)
    for p in stale:
        (where,) = [w for w in freshest if w[1] == p]
        best = max(o[p] for o in offsets.values() if p in o)
        assert snapshot_next_offset(freshest[where], where) == best
    assert len(freshest) == PARTITIONS

"""The scale-out chaos run into one lake: three projectors, each on a state directory of its
own, killed (SIGKILL), stopped past their session (SIGSTOP, SIGCONT) and added, all
committing to one DuckLake (a real PostgreSQL catalog, moto's S3) while agents write.

The run is ``stepledger chaos --projectors 3 --lake ... --rebuild-lake ...`` on Apache
Kafka, the file mode's scale-out harness with its lake variant
(:mod:`stepledger_dev.chaos.lake_run`): besides every chaos invariant, the lake equals a
rebuild into a fresh lake (every table, each partition's offset included), each partition
was read from offset 0 once (by its first owner: later owners continued from the lake's
offset), and an analyst in a third process saw one consistent cut at every read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stepledger.readers.lake import LakeConfig
from stepledger_dev.lake_stack import LakeStack
from tests.e2e.test_chaos import external, run_chaos
from tests.lake.conftest import lake_offsets

__all__ = ["external"]

PARTITIONS = 8


@pytest.mark.e2e
@pytest.mark.kafka_only
@pytest.mark.timeout(300)
def test_three_projectors_killed_stopped_and_added_commit_one_lake_equal_to_a_rebuild(
    tmp_path: Path,
    src_env: dict[str, str],
    external: Callable[..., list[str]],
    stack: LakeStack,
    lake: LakeConfig,
) -> None:
    fresh = stack.new_lake()
    args = ("--projectors", "3", "--recoverers", "1", "--workflows", "8", "--seed", "4")
    into = ("--lake", lake.catalog, "--data-path", lake.data_path, "--rebuild-lake", fresh.catalog)
    given = external(*args, *into, "--duration", "150")
    code, report, output = run_chaos(tmp_path, {**src_env, **stack.env()}, *given)
    assert code == 0, output
    assert report["passed"] and report["violations"] == [], report["violations"]
    counts = {row["point"]: row["count"] for row in report["crash_points"]}
    for point in ("projector:mid_batch", "consumer:sigstop_sigcont", "projector:added"):
        assert counts.get(point) == 1, (point, counts)
    assert report["members"]["projector"] == 4
    # Every partition read from offset 0 once, whoever owned it later on whichever directory.
    assert report["replays_from_zero"]["projector"] == {str(p): 1 for p in range(PARTITIONS)}
    by_member = report["projector_replays_by_member"]
    assert len([m for m, replays in by_member.items() if replays]) >= 1, by_member
    # Each partition's offset in the lake is its end in the log: exactly what was projected.
    offsets = {int(p): o for p, o in report["lake_offsets"].items()}
    assert sorted(offsets) == list(range(PARTITIONS))
    assert sum(offsets.values()) == report["events"] > 0
    assert {p: o for (_, p), o in lake_offsets(fresh, report["topic"]).items()} == offsets
    # The analyst read the lake while it was written, one consistent cut each time.
    assert report["analyst_cuts"] >= 3
    work = tmp_path / "work"
    assert not (work / "shards").exists()
    assert {p.name for p in work.glob("projector-*") if p.is_dir()} <= {
        f"projector-{n}" for n in range(4)
    }

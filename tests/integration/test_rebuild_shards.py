"""``stepledger rebuild --db DIR``: every shard of a shard directory, or one, from offset 0,
each under the one-writer fence a live projector holds."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.errors import ConfigError
from stepledger.projector.rebuild import rebuild as rebuild_file
from stepledger.projector.rebuild_shards import rebuild_shards
from stepledger.projector.schema import TABLES
from stepledger.readers.snapshots import connect_union, shard_path, shard_snapshots
from tests.conftest import Factory
from tests.integration.projector_helpers import STEPLEDGER, cli, produce_events, wait_for
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log

PARTITIONS = 8


def rebuild(
    env: dict[str, str], settings: Settings, db: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return cli(
        env,
        "rebuild",
        *("--bootstrap", settings.bootstrap, "--topic", settings.topic),
        *("--dlq-topic", settings.dlq_topic, "--db", str(db), "--no-progress"),
        *extra,
        timeout=120,
    )


def union_contents(shards: Path) -> dict[str, list[tuple[object, ...]]]:
    con = connect_union(shards)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_shard_directory_is_rebuilt_whole_or_one_shard_and_never_under_a_live_projector(
    make_settings: Factory, src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    events = random_log(seed=12, workflows=60)
    produce_events(settings, events)
    shards, single = tmp_path / "shards", tmp_path / "one.duckdb"
    done = rebuild(src_env, settings, shards)
    assert done.returncode == 0, done.stderr
    assert sorted(p for _, p in shard_snapshots(shards)) == list(range(PARTITIONS))
    rebuild_file(settings, single)
    whole = table_contents(single)
    assert union_contents(shards) == whole
    ends = {int(p): int(o) for _, p, o in whole["offsets"]}
    assert sum(ends.values()) == len(events)
    assert "pass --force" in one_line_error(rebuild(src_env, settings, shards))

    # One shard lost: rebuilt alone, the other shards left as they were.
    lost = shard_path(shards, settings.topic, 3)
    others = {p: p.stat().st_mtime_ns for p in shards.glob("*.p000[!3].duckdb")}
    assert len(others) == PARTITIONS - 1
    for path in shards.glob(f"{lost.name.removesuffix('.duckdb')}*"):
        path.unlink()
    assert rebuild_shards(settings, shards, partitions=(3,)).records == ends[3] > 0
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert union_contents(shards) == whole
    # Rebuilt again over itself: the same rows, not twice the rows.
    with pytest.raises(ConfigError, match="pass --force"):
        rebuild_shards(settings, shards, partitions=(3,))
    rebuild_shards(settings, shards, partitions=(3,), force=True)
    assert union_contents(shards) == whole

    past = one_line_error(rebuild(src_env, settings, shards, "--partition", "8", "--force"))
    assert "partition 8 does not exist" in past
    assert "--partition needs --db naming a shard directory" in one_line_error(
        rebuild(src_env, settings, single, "--partition", "0", "--force")
    )

    # A projector continues from the rebuilt shards (none is missing) and holds them: a
    # forced rebuild is refused in one line, touches nothing, and the projector runs on.
    log = tmp_path / "projector.log"
    with open(log, "w") as err:
        projector = subprocess.Popen(
            [
                *STEPLEDGER,
                "project",
                *("--bootstrap", settings.bootstrap, "--topic", settings.topic),
                *("--dlq-topic", settings.dlq_topic, "--db", str(shards)),
                *("--group", f"projector-{settings.topic}", "--session-timeout", "2"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=src_env,
        )
    try:
        # Every shard is open (locked) before the assignment is logged.
        wait_for(lambda: " assigned " in log.read_text(), 60, "the projector's assignment")
        refused = one_line_error(rebuild(src_env, settings, shards, "--force"))
        assert "is in use (is a projector writing it?)" in refused
        assert projector.poll() is None, "the projector must keep running"
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(60)
    assert projector.returncode == 0, log.read_text()[-2000:]
    assert "no shard for" not in log.read_text()
    assert union_contents(shards) == whole

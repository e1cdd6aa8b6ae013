"""The projector's commands as real processes: project + query, status, rebuild, dlq."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stepledger.cli import cli as main_group
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.deadletters.letter import original_headers
from stepledger.errors import ConfigError
from stepledger.kafka.reader import read_topic
from stepledger.projector.snapshot import latest_snapshot
from stepledger_dev.broker import free_port
from tests.integration.projector_helpers import (
    cli,
    produce_events,
    produce_raw,
    producer,
    projecting,
    query_one,
    snapshot_count,
    spawn_projector,
    wait_for,
)
from tests.integration.test_projector import poison, saga_log
from tests.unit.factories import factory
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import TOOLS, random_log

INTERVAL = 1.0
#: The most stale an analyst's snapshot may be (docs/benchmarks.md, the projector's lag).
STALE_LIMIT_S = 5.0


def test_query_works_while_project_runs_and_is_at_most_the_interval_stale(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    db = tmp_path / "ledger.duckdb"
    port = free_port()
    proc = spawn_projector(
        settings,
        db,
        src_env,
        "--snapshot-interval",
        str(INTERVAL),
        "--metrics-port",
        str(port),
        "--log-format",
        "json",
    )
    try:
        wait_for(lambda: latest_snapshot(db), 30, "the first snapshot")
        log = saga_log()
        produce_events(settings, log[:1])
        wait_for(lambda: snapshot_count(db) == 1, 60, "the group join and a first event")
        # Staleness: from acknowledged to visible in the snapshot analysts read.
        lags = []
        for i, event in enumerate(log[1:6], start=2):
            acked = time.monotonic()
            produce_events(settings, [event])

            def in_snapshot(count: int = i) -> bool:
                return snapshot_count(db) >= count

            wait_for(in_snapshot, 30, f"event {i} in a snapshot")
            lags.append(time.monotonic() - acked)
        # Typically within the interval plus a publication; never past the documented 5 s
        # (beside a second test worker one publication took 2.6 s of a 1 s interval, and
        # the median of one run was 2.09 s: [2.09, 3.20, 2.70, 0.74, 0.99]).
        assert statistics.median(lags) <= INTERVAL + 1.5, lags
        assert max(lags) <= STALE_LIMIT_S, lags

        shown = cli(
            src_env,
            "query",
            "--db",
            str(db),
            "--format",
            "json",
            "SELECT count(*) AS n FROM events",
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == [{"n": 6}]
        table = cli(
            src_env, "query", "--db", str(db), "SELECT step_id, status FROM steps ORDER BY 1"
        )
        assert "charge" in table.stdout and "succeeded" in table.stdout
        refused = cli(src_env, "query", "--db", str(db), "DELETE FROM events")
        assert refused.returncode == 1
        assert (
            refused.stderr.strip().startswith("Error: refused: DELETE")
            and "\n" not in refused.stderr.strip()
        )
        copy = cli(src_env, "query", "--db", str(db), f"COPY events TO '{tmp_path / 'x.csv'}'")
        assert (
            copy.returncode == 1 and "refused" in copy.stderr and not (tmp_path / "x.csv").exists()
        )
        sneaky = cli(src_env, "query", "--db", str(db), "SELECT * FROM read_text('/etc/hostname')")
        assert sneaky.returncode == 1 and "refused" in sneaky.stderr

        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        assert "stepledger_projector_events_total 6.0" in metrics
        assert "stepledger_projector_batch_seconds_count" in metrics
        assert "stepledger_projector_consumer_lag" in metrics

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stderr = proc.stderr.read() if proc.stderr else ""
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert any(line["message"] == "projector stopped cleanly" for line in lines)
    assert query_one(db, "SELECT count(*) FROM events") == [(6,)]


def test_status_shows_the_steps_in_order(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    db = tmp_path / "ledger.duckdb"
    with projecting(settings, db) as daemon:
        daemon.wait_received(produce_events(settings, saga_log()))
    runner = CliRunner()
    table = runner.invoke(main_group, ["status", "trip", "--db", str(db)])
    assert table.exit_code == 0, table.output
    order = [
        line.split("│")[2].strip() for line in table.output.splitlines() if line.count("│") > 5
    ]
    assert order == ["charge", "hotel", "car", "mail", "quote", "card"]
    assert "declined" in table.output and "(in doubt)" in table.output
    as_json = json.loads(
        runner.invoke(main_group, ["status", "trip", "--db", str(db), "--json"]).output
    )
    assert as_json["workflow"]["status"] == "running"
    assert [s["status"] for s in as_json["steps"]][:2] == ["succeeded", "compensated"]
    # The timeline picture: one row per step, in the same order, the in-doubt one hatched.
    svg = tmp_path / "trip.svg"
    drawn = runner.invoke(main_group, ["status", "trip", "--db", str(db), "--svg", str(svg)])
    assert drawn.exit_code == 0, drawn.output
    rows = [
        g
        for g in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}g")
        if g.get("class") == "tl-step"
    ]
    assert [r.get("data-status") for r in rows] == [s["status"] for s in as_json["steps"]]
    assert "url(#tl-wait)" in svg.read_text()
    # Through the real entry point: a user error is one line and exit code 1.
    missing = cli(src_env, "status", "nope", "--db", str(db))
    assert missing.returncode == 1 and "not in the projection" in missing.stderr


def test_rebuild_equals_the_incremental_tables(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    db, rebuilt = tmp_path / "ledger.duckdb", tmp_path / "rebuilt.duckdb"
    log = random_log(seed=31, workflows=40)
    with projecting(settings, db, batch_size=50) as daemon:
        daemon.wait_received(produce_events(settings, log[: len(log) // 2]))
        daemon.wait_received(produce_events(settings, log[len(log) // 2 :]) + len(log) // 2)
    args = [
        "rebuild",
        "--bootstrap",
        settings.bootstrap,
        "--topic",
        settings.topic,
        "--db",
        str(rebuilt),
    ]
    done = cli(src_env, *args)
    assert done.returncode == 0, done.stderr
    assert f"{len(log)} records" in done.stdout
    assert table_contents(rebuilt) == table_contents(db)
    assert latest_snapshot(rebuilt) is not None
    again = cli(src_env, *args)
    assert again.returncode == 1 and "--force" in again.stderr
    forced = cli(src_env, *args, "--force")
    assert forced.returncode == 0 and table_contents(rebuilt) == table_contents(db)


def test_a_file_held_by_another_process_is_a_one_line_error(
    settings: Settings, tmp_path: Path, src_env: dict[str, str]
) -> None:
    db = tmp_path / "ledger.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb,sys; c=duckdb.connect({str(db)!r}); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=src_env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = spawn_projector(settings, db, src_env)
        assert proc.wait(30) == 1
        err = (proc.stderr.read() if proc.stderr else "").strip()
        assert (
            err.startswith("Error: cannot open projection")
            and "lock" in err.lower()
            and "\n" not in err
        )
    finally:
        holder.communicate("", timeout=10)


def test_dlq_list_and_replay(settings: Settings, tmp_path: Path, src_env: dict[str, str]) -> None:
    bad = poison(settings)
    good = [factory().intent("wf", "s", TOOLS[0], {}, sequence=0)]
    with projecting(settings, tmp_path / "p.duckdb") as daemon:
        produce_raw(settings, bad)
        daemon.wait_received(len(bad) + produce_events(settings, good))
    common = [
        "--bootstrap",
        settings.bootstrap,
        "--topic",
        settings.topic,
        "--dlq-topic",
        settings.dlq_topic,
    ]
    runner = CliRunner()
    listed = runner.invoke(main_group, ["dlq", "list", *common, "--json"])
    assert listed.exit_code == 0, listed.output
    letters = [json.loads(line) for line in listed.output.splitlines()]
    assert sorted(x["stage"] for x in letters) == ["decode", "decode", "schema", "validate"]
    assert {x["key"] for x in letters} == {"k-decode", "k-schema", "k-validate", "k-empty"}
    table = runner.invoke(main_group, ["dlq", "list", *common])
    assert "4 dead letters" in table.output and "validate" in table.output

    nothing = runner.invoke(main_group, ["dlq", "replay", *common])
    assert isinstance(nothing.exception, ConfigError) and "--all" in str(nothing.exception)
    schema_letter = next(x for x in letters if x["stage"] == "schema")
    position = f"{schema_letter['dlq_partition']}:{schema_letter['dlq_offset']}"
    replayed = runner.invoke(main_group, ["dlq", "replay", *common, "--offset", position])
    assert replayed.exit_code == 0, replayed.output
    assert replayed.output.startswith(f"replayed {position} -> {settings.topic}[")
    records = list(read_topic(settings, Codec(), idle_timeout=0.3))
    copies = [r for r in records if r.key == b"k-schema"]
    assert len(copies) == 2
    assert copies[1].value == copies[0].value
    assert (
        original_headers(copies[1].headers) == original_headers(copies[0].headers) == [("h", b"2")]
    )


def test_dlq_replay_keeps_null_keys_values_and_valueless_headers(
    make_settings: Any, tmp_path: Path, src_env: dict[str, str]
) -> None:
    settings = make_settings(partitions=1)
    target = make_settings(partitions=1)
    out = producer(settings)
    out.produce(settings.topic, None, None, headers=[("empty", None), ("h", b"v")])
    out.produce(settings.topic, b"\xff", None, headers=[("h", b"v")])
    assert out.flush(30) == 0
    with projecting(settings, tmp_path / "p.duckdb") as daemon:
        daemon.wait_received(2)
    kafka = ("--bootstrap", settings.bootstrap, "--topic", settings.topic)
    replayed = cli(
        src_env,
        "dlq",
        "replay",
        *kafka,
        "--dlq-topic",
        settings.dlq_topic,
        "--all",
        "--to",
        target.topic,
    )
    assert replayed.returncode == 0, replayed.stderr
    again = list(read_topic(target, Codec(), idle_timeout=0.3))
    assert [(r.key, r.value, original_headers(r.headers)) for r in again] == [
        (None, None, [("empty", None), ("h", b"v")]),
        (None, b"\xff", [("h", b"v")]),
    ]
    # Each replayed record names the letter it came from, after the original headers.
    assert [r.headers[-1][0] for r in again] == ["dlq_replay_of", "dlq_replay_of"]
